# The MLflow server of infra/compose: the project's MLflow pin, PostgreSQL and S3 (MinIO) clients.
FROM python:3.11-slim
RUN pip install --no-cache-dir "mlflow[auth]==3.17.2" psycopg2-binary==2.9.11 boto3==1.43.11
