"""Start bertflow's servers without docker, check them, stop them: what infra/compose runs.

    python infra/compose/check_local.py [--backend auto|postgres|sqlite] [--keep-seconds N]

Starts, each on 127.0.0.1 and a free port: PostgreSQL (``initdb``/``pg_ctl`` when installed,
and ``psycopg2``; else SQLite files), the MLflow tracking server behind its basic-auth app
(``--app-name basic-auth``, artifacts proxied by the server to a local folder standing in for
the bucket), and the Prefect server behind its API auth string. Then checks:

1. both answer their health route without credentials;
2. MLflow refuses an API call without credentials (401) and with a wrong password (401), and
   accepts the admin's; Prefect the same;
3. a run logged through the authenticated client (a metric and an artifact) reads back, and
   the artifact went through the server into the artifact folder;
4. the project's own preflight (``flows.tracking.check_tracking_uri``) accepts the server;
5. every listening socket of the started processes is bound to 127.0.0.1 (``/proc/net/tcp``).

Stops everything it started (its own process ids only), prints one line per check and exits 0
when all pass, 1 otherwise. Design choice: the same server commands and settings as the
compose file (docker-compose.yml), so this script is the compose setup's test where no docker
daemon runs; MinIO is replaced by a folder (the bucket itself is not what is checked here).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, auth: tuple[str, str] | None = None, data: dict | None = None) -> tuple[int, str]:
    req = urllib.request.Request(
        url, data=json.dumps(data).encode() if data is not None else None, headers={"Content-Type": "application/json"}
    )
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout: float = 180) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if http(url)[0] == 200:
                return time.monotonic() - start
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url}: not healthy after {timeout:.0f} s:\n{log.read_text()[-3000:]}")


class Postgres:
    """A throwaway PostgreSQL cluster on 127.0.0.1 (run as the ``postgres`` user when we are root)."""

    def __init__(self, work: Path):
        self.dir, self.port, self.password = work / "pg", free_port(), secrets.token_urlsafe(16)
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    @staticmethod
    def available() -> bool:
        try:
            import psycopg2  # noqa: F401 - only whether the driver is installed
        except ImportError:
            return False
        return bool(shutil.which("initdb") and shutil.which("pg_ctl") and shutil.which("createdb"))

    def start(self) -> None:
        self.dir.mkdir()
        pwfile = self.dir.parent / "pgpass.txt"
        pwfile.write_text(self.password)
        if self.as_user:
            os.chmod(self.dir.parent, 0o711)
            shutil.chown(self.dir, "postgres")
            shutil.chown(pwfile, "postgres")
        pwfile.chmod(0o600)
        data = self.dir / "data"
        subprocess.run(
            [*self.as_user, "initdb", "-D", str(data), "-U", "bertflow", "--auth=scram-sha-256", f"--pwfile={pwfile}"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        subprocess.run(
            [
                *self.as_user,
                "pg_ctl",
                "-D",
                str(data),
                "-l",
                str(self.dir / "log.txt"),
                "-w",
                "-o",
                f"-h 127.0.0.1 -p {self.port} -k {self.dir}",
                "start",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        env = {**os.environ, "PGPASSWORD": self.password}
        for db in ("mlflow", "prefect"):
            subprocess.run(
                ["createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "bertflow", db],
                check=True,
                env=env,
                capture_output=True,
                timeout=60,
            )

    def url(self, db: str, driver: str = "postgresql") -> str:
        return f"{driver}://bertflow:{self.password}@127.0.0.1:{self.port}/{db}"

    def stop(self) -> None:
        subprocess.run(
            [*self.as_user, "pg_ctl", "-D", str(self.dir / "data"), "-m", "fast", "stop"],
            capture_output=True,
            timeout=60,
        )


def listening_addresses(pids: list[int]) -> dict[int, str]:
    """{port: local address} of the TCP sockets in LISTEN state owned by ``pids`` (and children)."""
    inodes: set[str] = set()
    todo, seen = list(pids), set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
            for tid in os.listdir(f"/proc/{pid}/task"):
                children = Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
                todo += [int(c) for c in children]
        except OSError:
            continue
    out = {}
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] != "0A" or f[9] not in inodes:  # 0A: LISTEN
                continue
            addr, port = f[1].split(":")
            if v6:
                host = "::1" if addr == "00000000000000000000000001000000" else ("::" if set(addr) == {"0"} else addr)
            else:
                host = socket.inet_ntoa(bytes.fromhex(addr)[::-1])
            out[int(port, 16)] = host
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--backend",
        choices=("auto", "postgres", "sqlite"),
        default="auto",
        help="database of both servers (auto: PostgreSQL when initdb and psycopg2 are here)",
    )
    parser.add_argument("--keep-seconds", type=float, default=0, help="leave the servers up this long after the checks")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bertflow-servers-"))
    use_pg = args.backend == "postgres" or (args.backend == "auto" and Postgres.available())
    if args.backend == "postgres" and not Postgres.available():
        print("check_local: --backend postgres needs initdb/pg_ctl/createdb on PATH and psycopg2", file=sys.stderr)
        return 2
    admin, password, prefect_password = "admin", secrets.token_urlsafe(12), secrets.token_urlsafe(12)
    procs: list[subprocess.Popen] = []
    pg = Postgres(work) if use_pg else None
    failures: list[str] = []

    def check(ok: bool, what: str) -> None:
        print(f"{'ok  ' if ok else 'FAIL'} {what}", flush=True)
        if not ok:
            failures.append(what)

    try:
        start = time.monotonic()
        if pg:
            pg.start()
            print(f"PostgreSQL 127.0.0.1:{pg.port} up in {time.monotonic() - start:.1f} s", flush=True)
        mlflow_port, prefect_port = free_port(), free_port()
        auth_ini = work / "basic_auth.ini"
        auth_ini.write_text(
            (Path(__file__).parent / "basic_auth.ini")
            .read_text()
            .replace("sqlite:////var/lib/mlflow-auth/basic_auth.db", f"sqlite:///{work}/basic_auth.db")
        )
        artifacts = work / "bucket"
        base_env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1"}
        for name in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
            base_env.pop(name, None)
        mlflow_env = {
            **base_env,
            "MLFLOW_AUTH_CONFIG_PATH": str(auth_ini),
            "MLFLOW_AUTH_ADMIN_USERNAME": admin,
            "MLFLOW_AUTH_ADMIN_PASSWORD": password,
            "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16),
        }
        store = pg.url("mlflow", "postgresql+psycopg2") if pg else f"sqlite:///{work}/mlflow.db"
        mlflow_log = work / "mlflow.log"
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "mlflow",
                    "server",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(mlflow_port),
                    "--backend-store-uri",
                    store,
                    "--artifacts-destination",
                    str(artifacts),
                    "--serve-artifacts",
                    "--app-name",
                    "basic-auth",
                    "--workers",
                    "1",
                ],
                env=mlflow_env,
                stdout=open(mlflow_log, "w"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=work,
            )
        )
        prefect_env = {
            **base_env,
            "PREFECT_HOME": str(work / "prefect"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_SERVER_API_AUTH_STRING": f"{admin}:{prefect_password}",
        }
        prefect_env.pop("PREFECT_API_URL", None)
        if pg:
            prefect_env["PREFECT_API_DATABASE_CONNECTION_URL"] = pg.url("prefect", "postgresql+asyncpg")
        prefect_log = work / "prefect.log"
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "prefect",
                    "server",
                    "start",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(prefect_port),
                    "--no-ui",
                ],
                env=prefect_env,
                stdout=open(prefect_log, "w"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=work,
            )
        )
        ml, pf = f"http://127.0.0.1:{mlflow_port}", f"http://127.0.0.1:{prefect_port}/api"
        t_ml = wait_healthy(ml + "/health", procs[0], mlflow_log)
        t_pf = wait_healthy(pf + "/health", procs[1], prefect_log)
        db = f"PostgreSQL ({pg.url('mlflow').split('@')[1]})" if pg else "SQLite"
        check(
            True,
            f"MLflow healthy {t_ml:.1f} s after launch, Prefect {t_pf:.1f} s after that (started together), "
            f"database {db}",
        )

        search = ml + "/api/2.0/mlflow/experiments/search?max_results=1"
        check(http(search)[0] == 401, "MLflow refuses an unauthenticated API call (401)")
        check(http(search, (admin, "wrong"))[0] == 401, "MLflow refuses a wrong password (401)")
        check(http(search, (admin, password))[0] == 200, "MLflow accepts the admin's credentials")
        flows = pf + "/flows/filter"
        check(http(flows, data={})[0] == 401, "Prefect refuses an unauthenticated API call (401)")
        check(http(flows, (admin, prefect_password), data={})[0] == 200, "Prefect accepts the auth string")

        env = {
            **base_env,
            "MLFLOW_TRACKING_USERNAME": admin,
            "MLFLOW_TRACKING_PASSWORD": password,
            "PYTHONPATH": str(REPO),
        }
        code = (
            "import sys, tempfile, os, mlflow\n"
            "from mlflow.tracking import MlflowClient\n"
            "from flows.tracking import check_tracking_uri\n"
            "check_tracking_uri(sys.argv[1])\n"
            "c = MlflowClient(sys.argv[1])\n"
            "exp = c.create_experiment('bertflow-check')\n"
            "run = c.create_run(exp).info.run_id\n"
            "c.log_metric(run, 'loss', 1.25, step=3)\n"
            "d = tempfile.mkdtemp(); p = os.path.join(d, 'note.txt'); open(p, 'w').write('hello bucket')\n"
            "c.log_artifact(run, p)\n"
            "c.set_terminated(run)\n"
            "print('RESULT', c.get_metric_history(run, 'loss')[0].value, c.get_run(run).info.artifact_uri)\n"
        )
        out = subprocess.run([sys.executable, "-c", code, ml], env=env, capture_output=True, text=True, timeout=120)
        result = [line.split() for line in out.stdout.splitlines() if line.startswith("RESULT ")]
        check(
            out.returncode == 0 and bool(result) and result[-1][1] == "1.25",
            "an authenticated client logs a run (metric reads back); the project's preflight accepts the server"
            + ("" if result else f": {out.stdout[-1000:]} {out.stderr[-1500:]}"),
        )
        stored = list(artifacts.rglob("note.txt"))
        check(
            len(stored) == 1 and stored[0].read_text() == "hello bucket",
            "the artifact went through the server into the artifact store (mlflow-artifacts:/ proxy)",
        )

        bound = listening_addresses([p.pid for p in procs])
        ours = {port: host for port, host in bound.items() if port in (mlflow_port, prefect_port)}
        check(
            ours.keys() == {mlflow_port, prefect_port} and set(bound.values()) <= {"127.0.0.1", "::1"},
            f"every listening socket is on loopback: {dict(sorted(bound.items()))}",
        )
        if args.keep_seconds:
            print(f"servers up: MLflow {ml} (admin / {password}), Prefect {pf} (admin:{prefect_password})", flush=True)
            time.sleep(args.keep_seconds)
    except Exception as exc:  # report and stop what was started
        check(False, f"{type(exc).__name__}: {exc}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if pg:
            pg.stop()
        shutil.rmtree(work, ignore_errors=True)
    print("all checks passed" if not failures else f"{len(failures)} check(s) failed", flush=True)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
