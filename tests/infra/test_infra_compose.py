"""The server setup: the compose file binds nothing publicly and puts auth in front of MLflow
(and Prefect); the slow test runs check_local.py, which starts the same servers without docker
and checks auth and loopback binding for real."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "infra/compose/docker-compose.yml"


def services() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def test_every_published_port_is_on_loopback():
    published = {name: s.get("ports", []) for name, s in services().items()}
    assert {"postgres", "mlflow", "prefect", "minio"} <= published.keys()
    for name, ports in published.items():
        for port in ports:
            spec = port if isinstance(port, str) else f"{port.get('host_ip', '')}:{port.get('published')}"
            assert re.fullmatch(r"127\.0\.0\.1:\d+:\d+", spec), f"{name}: {port} is not bound to 127.0.0.1"
    assert published["mlflow"] and published["prefect"]  # the two servers are reachable (on loopback)


def test_mlflow_sits_behind_auth_on_postgres_with_a_bucket():
    s = services()
    mlflow = s["mlflow"]
    args = " ".join(mlflow["command"])
    assert "--app-name=basic-auth" in args  # every route but /health needs credentials
    assert re.search(r"--backend-store-uri=postgresql\+psycopg2://\S+@postgres:5432/mlflow", args)
    assert "--artifacts-destination=s3://" in args and "--serve-artifacts" in args
    env = mlflow["environment"]
    assert env["MLFLOW_S3_ENDPOINT_URL"] == "http://minio:9000"
    assert env["MLFLOW_AUTH_ADMIN_PASSWORD"].startswith("${") and ":?" in env["MLFLOW_AUTH_ADMIN_PASSWORD"]
    assert "MLFLOW_FLASK_SERVER_SECRET_KEY" in env
    assert "postgres" in mlflow["depends_on"] and "minio-bucket" in mlflow["depends_on"]
    prefect = s["prefect"]["environment"]
    assert prefect["PREFECT_API_DATABASE_CONNECTION_URL"].startswith("postgresql+asyncpg://")
    assert prefect["PREFECT_SERVER_API_AUTH_STRING"].startswith("admin:${")
    ini = (REPO / "infra/compose/basic_auth.ini").read_text()
    assert "admin_password" not in ini  # the password comes from the environment, never the file
    for needed in re.findall(r"\$\{(\w+):\?", COMPOSE.read_text()):  # every required secret is in the example
        assert re.search(rf"^{needed}=", (REPO / "infra/compose/env.example").read_text(), re.M), needed
    dockerfile = (REPO / "infra/compose/mlflow.Dockerfile").read_text()
    assert "mlflow[auth]==3.17.2" in dockerfile and "psycopg2-binary" in dockerfile


@pytest.mark.slow
@pytest.mark.skipif(
    __import__("importlib").util.find_spec("flask_wtf") is None,
    reason="MLflow's basic-auth app needs the servers extra (pip install -e '.[servers]')",
)
def test_the_servers_start_refuse_strangers_and_accept_the_admin():
    out = subprocess.run(
        [sys.executable, str(REPO / "infra/compose/check_local.py")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    for line in (
        "MLflow refuses an unauthenticated API call (401)",
        "MLflow accepts the admin's credentials",
        "Prefect refuses an unauthenticated API call (401)",
        "every listening socket is on loopback",
        "the artifact went through the server",
    ):
        assert f"ok   {line}" in out.stdout
    assert "all checks passed" in out.stdout
