"""Beam's local runner at 2+ workers with worker processes forked from the driver.

Beam's ``FnApiRunner`` in ``multi_processing`` mode starts every SDK worker as a fresh
``python -m apache_beam.runners.worker.sdk_worker_main``: each one imports Beam, pyarrow,
tokenizers and our modules again (1.5-1.8 s on this machine, measured) and tears them down at
exit (~0.5 s, one worker after the other). On a job of a few seconds that fixed cost is most of
the run: the examples job on 20 MB took longer at 2 workers than at 1 (issue 7), and the corpus
stage did not scale (issue 6).

The choice: :class:`ForkingFnApiRunner` forks the worker processes from the driver when a run
starts, before the runner opens any gRPC server. A fork shares the modules the driver has
already imported (copy-on-write) and takes milliseconds. Each forked process waits on a pipe;
when the runner asks for a worker, the handler (:class:`ForkedWorkerHandler`) sends it the
environment Beam would have given the subprocess (control and logging endpoints, worker id,
pipeline options) and the process runs Beam's own harness (``sdk_worker_main.main``), then
leaves with ``os._exit`` (no module teardown, none of the driver's ``atexit`` handlers). The
pipeline, its options and what the workers run are those of ``multi_processing``: only the way
the process is started differs, so the output is the same (tested).

The cost and the limits: Linux only (``fork``; elsewhere Beam's own workers are used); the
workers start with the driver's memory image (shared, but counted in each process's RSS);
a driver that already used gRPC (an earlier multi-worker run in the same process) is forked
too, which gRPC's core tolerates when no channel or server is open at the moment of the fork
(the runner closes its servers when a run ends: tested with runs back to back in one process).
``BeamConfig.fork_workers = false`` returns to Beam's subprocess workers.
"""

from __future__ import annotations

import importlib
import json
import logging
import multiprocessing
import os
import sys
import threading
import traceback
import uuid

from apache_beam.portability import python_urns
from apache_beam.portability.api import endpoints_pb2
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.runners.portability.fn_api_runner.worker_handlers import GrpcWorkerHandler, WorkerHandler
from google.protobuf import json_format, text_format

log = logging.getLogger(__name__)

URN = "bertflow:env:forked_python:v1"
"""Environment URN of forked workers; its payload names the pool of processes forked for a run."""

PRELOAD = ("apache_beam.runners.worker.sdk_worker_main", "pyarrow.dataset", "grpc._interceptor")
"""Modules every worker imports (measured): imported by the driver before it forks."""

_POOLS: dict[str, list[_ForkedProcess]] = {}
_WRITE_FDS: set[int] = set()
"""The driver's ends of the pipes of idle forked processes: a new fork closes its copies."""
_LOCK = threading.Lock()


def can_fork() -> bool:
    """Whether this platform forks safely enough for the workers (Linux)."""
    return sys.platform.startswith("linux") and hasattr(os, "fork")


def _read_message(fd: int) -> bytes:
    """A length-prefixed message, or b"" when the pipe closes first."""
    data = b""
    while len(data) < 8 or len(data) < 8 + int.from_bytes(data[:8], "big"):
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b""
        data += chunk
    return data[8:]


def _fresh_thread_state() -> None:
    """Replace what the driver's threads left behind that a forked process would wait on.

    Only the forking thread survives a fork: Beam's shared thread pool would hand bundles to
    idle threads of an earlier run that no longer exist here."""
    from apache_beam.utils import thread_pool_executor

    thread_pool_executor._SHARED_UNBOUNDED_THREAD_POOL_EXECUTOR = (
        thread_pool_executor._SharedUnboundedThreadPoolExecutor()
    )


def _child_main(fd: int, threads: int) -> None:
    """The forked process: wait for the worker environment, run Beam's harness, exit."""
    code = 1
    try:
        # Native thread pools (tokenizers' rayon) sized to this worker's share of the cores, not
        # all of them in every worker; only where the driver has not started the pool already.
        os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
        data = _read_message(fd)
        os.close(fd)
        if not data:  # the run ended (or failed) before it needed this worker
            code = 0
            return
        os.environ.update(json.loads(data))
        _fresh_thread_state()
        root = logging.getLogger()
        for handler in list(root.handlers):  # as in a fresh process: Beam adds its own
            root.removeHandler(handler)
        from apache_beam.runners.worker import sdk_worker_main

        sdk_worker_main.main([])
        code = 0
    except BaseException:  # reported on stderr, exit code 1
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


class _ForkedProcess:
    """One forked worker process, idle until :meth:`start` sends it its environment."""

    def __init__(self, threads: int = 1):
        read_fd, self.fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            for fd in _WRITE_FDS | {self.fd}:
                os.close(fd)
            _child_main(read_fd, threads)  # never returns
        os.close(read_fd)
        _WRITE_FDS.add(self.fd)
        self.pid = pid
        self.returncode: int | None = None

    def start(self, env: dict[str, str]) -> None:
        data = json.dumps(env).encode("utf-8")
        view = memoryview(len(data).to_bytes(8, "big") + data)
        while view:
            view = view[os.write(self.fd, view) :]
        self.close_pipe()

    def close_pipe(self) -> None:
        if self.fd >= 0:
            _WRITE_FDS.discard(self.fd)
            os.close(self.fd)
            self.fd = -1

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


@WorkerHandler.register_environment(URN, bytes)
class ForkedWorkerHandler(GrpcWorkerHandler):
    """A Beam worker handler whose worker is a process forked when the run started."""

    def __init__(self, payload: bytes, state, provision_info, grpc_server):
        super().__init__(state, provision_info, grpc_server)
        self._pool_id = payload.decode("utf-8")
        self._process: _ForkedProcess | None = None

    def start_worker(self) -> None:
        with _LOCK:
            pool = _POOLS.get(self._pool_id)
            if not pool:
                raise RuntimeError(f"no forked worker left in pool {self._pool_id} (more workers than forked)")
            self._process = pool.pop()
        env = {
            "CONTROL_API_SERVICE_DESCRIPTOR": text_format.MessageToString(
                endpoints_pb2.ApiServiceDescriptor(url=self.control_address)
            ),
            "LOGGING_API_SERVICE_DESCRIPTOR": text_format.MessageToString(self.logging_api_service_descriptor()),
            "PIPELINE_OPTIONS": json_format.MessageToJson(self.provision_info.provision_info.pipeline_options),
            "WORKER_ID": self.worker_id,
        }
        self._process.start(env)

    def stop_worker(self) -> None:
        if self._process is not None and self._process.wait():
            raise RuntimeError(f"forked worker {self._process.pid} exited with code {self._process.returncode}")


class ForkingFnApiRunner(FnApiRunner):
    """FnApiRunner whose ``multi_processing`` workers are forked from the driver.

    Give it the usual options (``--direct_num_workers=N --direct_running_mode=multi_processing``):
    the SDK-subprocess environment Beam builds from them is swapped for :data:`URN` and N
    processes are forked before the run opens its gRPC servers."""

    def run_via_runner_api(self, pipeline_proto, options):
        from apache_beam.options.pipeline_options import DirectOptions

        workers = options.view_as(DirectOptions).direct_num_workers
        if workers == 0:  # Beam's "one per CPU", as FnApiRunner counts them
            workers = multiprocessing.cpu_count()
        workers = workers or 1
        pool_id = uuid.uuid4().hex
        swapped = False
        for env in pipeline_proto.components.environments.values():
            if env.urn == python_urns.SUBPROCESS_SDK:
                env.urn, env.payload = URN, pool_id.encode("utf-8")
                swapped = True
        if not swapped:
            return super().run_via_runner_api(pipeline_proto, options)
        for name in PRELOAD:  # once here rather than once in every worker
            try:
                importlib.import_module(name)
            except ImportError:
                pass
        sys.stdout.flush()
        sys.stderr.flush()
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        pool = [_ForkedProcess(max(1, cores // workers)) for _ in range(workers)]
        with _LOCK:
            _POOLS[pool_id] = list(pool)
        try:
            return super().run_via_runner_api(pipeline_proto, options)
        finally:
            with _LOCK:
                _POOLS.pop(pool_id, None)
            for process in pool:  # unused ones see the pipe close and exit; all are reaped
                process.close_pipe()
                process.wait()
