-- The Prefect server's database next to MLflow's (POSTGRES_DB); runs once, on an empty volume.
CREATE DATABASE prefect OWNER bertflow;
