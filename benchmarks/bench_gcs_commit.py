"""Committing a manifest on gs://: write-then-rename (the old way) against one object write
(``pipeline.schema.storage.write_atomically``), side by side, on a local GCS emulator.

    python benchmarks/bench_gcs_commit.py --writes 3          # starts gcp-storage-emulator itself
    STORAGE_EMULATOR_HOST=http://127.0.0.1:9123 python benchmarks/bench_gcs_commit.py --writes 3

The emulator has no ``moveTo`` API, so gcsfs's ``mv`` retries it (answer 501), logs a traceback
and falls back to copy + delete; real GCS has ``moveTo`` (on hierarchical-namespace buckets) and
otherwise copies too. Either way a rename on an object store is more requests than one upload,
and a GCS upload is already atomic: the object appears only when it is complete. Prints the
seconds per manifest write of each way and the number of gcsfs log records at WARNING or above.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # before gcsfs is imported


class _Count(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.n = 0

    def emit(self, record):
        self.n += 1


def start_emulator() -> subprocess.Popen:
    exe = shutil.which("gcp-storage-emulator") or str(Path(sys.executable).with_name("gcp-storage-emulator"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [exe, "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1).read()
            break
        except OSError:
            time.sleep(0.05)
    os.environ["STORAGE_EMULATOR_HOST"] = url
    return proc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--writes", type=int, default=3, help="manifest writes per way (the old way takes ~35 s each)")
    args = ap.parse_args()
    proc = None if os.environ.get("STORAGE_EMULATOR_HOST") else start_emulator()
    try:
        import fsspec

        from pipeline.schema.manifest import Manifest, manifest_url, save_manifest

        fs = fsspec.filesystem("gs", token="anon")
        bucket = f"bench-{os.getpid()}"
        fs.mkdir(bucket)
        counter = _Count()
        logging.getLogger("gcsfs").addHandler(counter)
        logging.getLogger("gcsfs").propagate = False  # counted, not printed
        manifest = Manifest("corpus", f"gs://{bucket}/run/corpus", {"num_shards": 2}, {}, {"documents": 3.0}, [])

        def old_way():
            fs_, path = fsspec.core.url_to_fs(manifest_url(manifest.url))
            with fs_.open(path + ".tmp", "w") as f:
                f.write(manifest.to_json())
            fs_.mv(path + ".tmp", path)

        rows = []
        ways = (("write .tmp + mv (before)", old_way), ("write_atomically (after)", lambda: save_manifest(manifest)))
        for name, write in ways:
            counter.n = 0
            times = []
            for _ in range(args.writes):
                t = time.perf_counter()
                write()
                times.append(time.perf_counter() - t)
            rows.append((name, min(times), sum(times) / len(times), max(times), counter.n))
        print(
            f"{'manifest commit on the emulator':28s} {'min s':>8s} {'mean s':>8s} {'max s':>8s} "
            f"{'gcsfs warnings+':>16s}"
        )
        for name, lo, mean, hi, n in rows:
            print(f"{name:28s} {lo:8.3f} {mean:8.3f} {hi:8.3f} {n:16d}")
        print(
            f"({args.writes} writes each; gcsfs {__import__('gcsfs').__version__}, "
            f"emulator {os.environ['STORAGE_EMULATOR_HOST']})"
        )
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
