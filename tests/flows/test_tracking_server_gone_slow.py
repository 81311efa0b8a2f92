"""A real ``mlflow server`` on 127.0.0.1 that goes away under a run (``flows.tracking``, design
choice 5): killed and back within the wait, a call resumes and nothing is lost; killed for good,
the call fails naming the server, and later calls of the process fail at once; restarted, the
same store takes the run's calls again. Slow (three server starts: 79 s at a load of 5 to 7); not in
CI, whose killed-server cases (test_tracking_server_killed_slow.py) go through the same path in a real run."""

import os
import signal
import subprocess
import threading

import pytest

from flows import tracking
from flows.tracking import Tracker, TrackingServerGone

pytestmark = pytest.mark.slow


def kill(server: subprocess.Popen) -> None:
    os.killpg(server.pid, signal.SIGKILL)  # the server and its workers: as a crashed host would
    server.wait(timeout=30)


def test_a_killed_server_is_waited_for_then_named_and_a_restarted_one_resumes(servers, tmp_path, monkeypatch):
    monkeypatch.setattr(tracking, "_GAVE_UP", set())
    port = servers.free_port()
    uri = f"http://127.0.0.1:{port}"
    server = servers.start_mlflow_server(tmp_path, port, new_session=True)[0]
    try:
        tracker = Tracker(uri)
        tracker.use_experiment("bertflow")
        run = tracker.start_run("pretrain")
        tracker.log_metrics(run, {"loss": 3.0}, step=1)

        # killed, and back within the wait: the call waits, then lands; nothing lost (the wait made
        # longer than a restart takes on a loaded test box; the default is UNREACHABLE_SECONDS)
        monkeypatch.setattr(tracking, "UNREACHABLE_SECONDS", 900.0)
        kill(server)
        done: dict = {}
        thread = threading.Thread(target=lambda: done.update(ok=tracker.log_metrics(run, {"loss": 2.0}, step=2)))
        thread.start()
        server = servers.start_mlflow_server(tmp_path, port, new_session=True)[0]
        thread.join(timeout=300)
        assert "ok" in done
        history = tracker.client.get_metric_history(run, "loss")
        assert [(m.step, m.value) for m in history] == [(1, 3.0), (2, 2.0)]

        # killed for good: the call fails naming the server, within the (shortened) wait
        monkeypatch.setattr(tracking, "UNREACHABLE_SECONDS", 3.0)
        kill(server)
        with pytest.raises(TrackingServerGone, match=f"MLflow tracking server {uri} refused connections"):
            tracker.log_metrics(run, {"loss": 1.0}, step=3)
        monkeypatch.setattr(tracking, "UNREACHABLE_SECONDS", 3600.0)  # a later call tries once only
        with pytest.raises(TrackingServerGone, match=uri):
            tracker.end_run(run, ok=False)

        # restarted on the same store: the run's calls land again
        server = servers.start_mlflow_server(tmp_path, port, new_session=True)[0]
        tracker.log_metrics(run, {"loss": 1.0}, step=3)
        tracker.end_run(run, ok=True)
        assert tracker.client.get_run(run).info.status == "FINISHED"
        assert [m.step for m in tracker.client.get_metric_history(run, "loss")] == [1, 2, 3]
    finally:
        if server.poll() is None:
            kill(server)
