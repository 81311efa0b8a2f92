"""Prefect's temporary server kept up between commands (``flows/shared_server.py``), the default
outside this suite: a second command uses the server the first one started, every flow run still
reaches the database, the server stops by itself once no command has used it for the linger,
never while a command holds its lease, and a dead server's state is replaced by a new server."""

import fcntl
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_prefect_server import HEAD

from flows.shared_server import DEFAULT_LINGER_S, ENV_LINGER, alive, linger_seconds, read_state

ROOT = Path(__file__).resolve().parents[2]

RUN = (
    HEAD
    + """
@flow(name=sys.argv[1])
def hello():
    get_run_logger().info("hello from %s", sys.argv[1])
    return double(21)

with temporary_server() as url:
    print("url", url, flush=True)
    print("result", hello(), flush=True)
"""
)


def _env(home, linger: float) -> dict[str, str]:
    env = {**os.environ, "PREFECT_HOME": str(home), "PYTHONPATH": str(ROOT), ENV_LINGER: str(linger)}
    env.pop("PREFECT_API_URL", None)
    return env


def _flow(name: str, env) -> tuple[str, int]:
    proc = subprocess.run([sys.executable, "-c", RUN, name], env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "result 42" in out, out[-3000:]
    assert "Error logging to API" not in out, out[-3000:]
    return out, int(out.split("url http://127.0.0.1:")[1].split("/")[0])


def _state(home) -> tuple[Path, dict | None]:
    (path,) = Path(home).glob("prefect.db.server-*.json")  # one server's state
    return path, read_state(str(path))


def _gone(pid: int, port: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) != 0
        time.sleep(0.2)
    return False


def _rows(home, query: str, want: int, within: float = 10.0) -> list:
    """``query``'s rows once there are ``want`` of them (the server records task runs from the
    command's events, which it may still be writing when the command has returned)."""
    deadline = time.monotonic() + within
    while True:
        with sqlite3.connect(Path(home) / "prefect.db") as db:
            rows = db.execute(query).fetchall()
        if len(rows) >= want or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def test_a_second_command_uses_the_first_ones_server_which_then_stops_by_itself(tmp_path):
    home = tmp_path / "home"
    env = _env(home, linger=4)
    first, port = _flow("first", env)
    assert "Starting temporary server on http://127.0.0.1:" in first and "shared" in first
    path, state = _state(home)
    assert state is not None and state["port"] == port
    os.kill(state["pid"], 0)  # up after the command that started it has exited
    second, port2 = _flow("second", env)
    assert port2 == port and "Using the temporary server on" in second and "Starting temporary" not in second
    assert read_state(str(path))["pid"] == state["pid"]
    flows = _rows(home, "select f.name, r.state_name from flow_run r join flow f on f.id = r.flow_id", 2)
    assert sorted(flows) == [("first", "Completed"), ("second", "Completed")]
    assert _rows(home, "select state_name from task_run", 2) == [("Completed",), ("Completed",)]
    logs = [m for (m,) in _rows(home, "select message from log where message like 'hello from %'", 2)]
    assert sorted(logs) == ["hello from first", "hello from second"]
    assert _gone(state["pid"], port, within=4 + 15), "the server outlived its linger"
    assert not path.exists()  # it removed its own state


def test_the_server_never_stops_under_a_command_that_holds_its_lease(tmp_path):
    home = tmp_path / "home"
    env = _env(home, linger=1)
    _, port = _flow("first", env)
    path, state = _state(home)
    clients = str(path).removesuffix(".json") + ".clients"
    fd = os.open(clients, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # what a command does while its flow runs
        time.sleep(4)
        os.kill(state["pid"], 0)  # still up, well past its linger
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) == 0
    finally:
        os.close(fd)
    assert _gone(state["pid"], port, within=15)


def test_a_dead_servers_state_is_replaced_by_a_new_server(tmp_path):
    home = tmp_path / "home"
    env = _env(home, linger=30)
    _, port = _flow("first", env)
    path, state = _state(home)
    os.kill(state["pid"], signal.SIGKILL)  # no chance to remove its state
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and alive(state["pid"]):
        time.sleep(0.1)
    assert read_state(str(path)) == state
    out, port2 = _flow("second", env)
    assert "Starting temporary server" in out
    new = read_state(str(path))
    assert new["pid"] != state["pid"] and new["port"] == port2
    path.write_text("not json")  # a state nobody can read: a new server too
    out, _ = _flow("third", env)
    assert "Starting temporary server" in out
    assert _gone(new["pid"], port2, within=15)  # nobody can find it any more: it stops at once
    os.kill(read_state(str(path))["pid"], signal.SIGTERM)


def test_commands_started_together_start_one_server(tmp_path):
    home = tmp_path / "home"
    env = _env(home, linger=3)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RUN, f"f{i}"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for i in range(3)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    ports = {int(o.split("url http://127.0.0.1:")[1].split("/")[0]) for o in outs}
    assert len(ports) == 1, outs
    assert sum("Starting temporary server" in o for o in outs) == 1
    assert len(_rows(home, "select id from flow_run", 3)) == 3
    _, state = _state(home)
    assert _gone(state["pid"], ports.pop(), within=20)


def test_where_the_servers_files_cannot_be_made_the_command_starts_its_own(tmp_path):
    home = tmp_path / "home"
    env = _env(home, linger=30)
    nowhere = (  # a folder nobody can write in
        "import flows.shared_server as s\n"
        "s.paths = lambda db, key: {k: f'/proc/none/x.{k}' for k in ('json', 'clients', 'lock', 'log')}\n"
    )
    command = [sys.executable, "-c", nowhere + RUN, "own"]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "result 42" in out, out[-3000:]
    assert "cannot be shared (/proc/none/x.clients" in out and "Stopping temporary server on" in out, out[-3000:]
    port = int(out.split("url http://127.0.0.1:")[1].split("/")[0])
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0  # stopped with the command, as with a linger of 0
    assert not list(home.glob("prefect.db.server-*"))


def test_the_linger_setting(monkeypatch):
    monkeypatch.delenv(ENV_LINGER, raising=False)
    assert linger_seconds() == DEFAULT_LINGER_S
    for given, want in (("0", 0.0), ("2.5", 2.5), (" 30 ", 30.0)):
        monkeypatch.setenv(ENV_LINGER, given)
        assert linger_seconds() == want
    for bad in ("-1", "soon", "nan"):
        monkeypatch.setenv(ENV_LINGER, bad)
        with pytest.raises(ValueError, match=ENV_LINGER):
            linger_seconds()


@pytest.mark.e2e
def test_bertflow_stage_commands_share_one_server_and_the_supervisor_leaves_it(tmp_path):
    """Through the CLI: the command's supervisor sweeps what is left of the worker's session, not
    the shared server; the next command uses it."""
    home = tmp_path / "home"
    env = _env(home, linger=5)
    outs = []
    for i in range(2):
        argv = ["stage", "corpus", "--preset", "tiny", "--root", str(tmp_path / f"root-{i}")]
        command = [sys.executable, "-m", "flows.cli", *argv]
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outs.append(proc.stderr)
    assert "Starting temporary server" in outs[0] and "Using the temporary server" in outs[1]
    _, state = _state(home)
    with sqlite3.connect(home / "prefect.db") as db:
        states = [s for (s,) in db.execute("select state_name from flow_run")]
    assert states == ["Completed", "Completed"]
    assert _gone(state["pid"], state["port"], within=5 + 15)
