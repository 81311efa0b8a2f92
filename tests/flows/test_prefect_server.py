"""Prefect's temporary server started by the command (``flows/prefect_server.py``), not by
Prefect's client: the flow's process never imports Prefect's server code, the flow run, its
task runs and its logs all reach the server's database, and the server is gone at the end."""

import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

HEAD = """
import logging, sys
from flows.prefect_db import prepare_prefect_database
from flows.prefect_server import temporary_server
prepare_prefect_database()
from prefect import flow, task, get_run_logger

@task
def double(x):
    get_run_logger().info("doubling %d", x)
    return 2 * x
"""
"""A script's start: Prefect's database prepared as the command prepares it, a task that logs."""

RUN = (
    HEAD
    + """
@flow
def hello():
    for i in range(20):
        get_run_logger().info("line %d", i)
    return double(21)

with temporary_server() as url:
    print("url", url)
    print("result", hello())
print("server code imported:", "prefect.server.api.server" in sys.modules)
"""
)


def test_the_flow_runs_against_a_server_started_here_and_nothing_is_lost(tmp_path):
    home = tmp_path / "home"
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "DO_NOT_TRACK": "1", "PYTHONPATH": str(ROOT)}  # fmt: skip
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.run([sys.executable, "-c", RUN], env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "result 42" in out and "url http://127.0.0.1:" in out
    assert "server code imported: False" in out  # Prefect's client would have imported it to start one
    assert "Starting temporary server on http://127.0.0.1:" in out
    assert "Stopping temporary server on http://127.0.0.1:" in out
    assert "Error logging to API" not in out and "View at" not in out, out[-3000:]
    port = out.split("url http://127.0.0.1:")[1].split("/")[0]
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):  # the server is gone
        s.connect(("127.0.0.1", int(port)))
    with sqlite3.connect(home / "prefect.db") as db:
        (state,) = db.execute("select state_name from flow_run").fetchone()
        tasks = db.execute("select state_name from task_run").fetchall()
        logs = [m for (m,) in db.execute("select message from log")]
    assert state == "Completed" and tasks == [("Completed",)]
    assert [f"line {i}" for i in range(20)] + ["doubling 21"] == [m for m in logs if m.startswith(("line", "doubling"))]


def test_a_configured_api_is_used_as_it_is(monkeypatch):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.prefect_server import temporary_server

    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        with temporary_server() as url:
            assert url is None and PREFECT_API_URL.value() == "http://127.0.0.1:9/api"
