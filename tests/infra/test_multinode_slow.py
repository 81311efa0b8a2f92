"""Two "nodes" on this machine through the real launcher's multi-node path (BERTFLOW_NNODES,
BERTFLOW_NODE_RANK, BERTFLOW_RDZV_ENDPOINT -> torchrun --nnodes/--node_rank, static rendezvous
on 127.0.0.1): one process per node trains to the same weights as two processes on one node."""

import socket
import sys
import threading
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
from pretrain_shards import write_example_stage

from flows.proc.launch import launch_pretrain

pytestmark = [pytest.mark.slow, pytest.mark.production]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_match_two_processes_on_one_node(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
    from test_distributed import spec  # the 2-part, no-dropout spec of the one-node tests

    examples = write_example_stage(tmp_path / "examples", lengths=(16,), n=240, shards=2, row_group_size=30)
    base = {"OMP_NUM_THREADS": "1"}
    one_node = tmp_path / "trace-one"
    one_node.mkdir()
    with open(tmp_path / "one.log", "w") as out:
        code = launch_pretrain(
            spec(examples, tmp_path / "one"), nproc=2, env={**base, "BERTFLOW_TRACE_DATA": str(one_node)}, output=out
        )
    assert code == 0, (tmp_path / "one.log").read_text()[-3000:]

    endpoint = f"127.0.0.1:{free_port()}"
    codes: dict[int, int] = {}
    two_nodes = tmp_path / "trace-two"
    two_nodes.mkdir()

    def node(rank: int) -> None:
        env = {
            **base,
            "BERTFLOW_TRACE_DATA": str(two_nodes),
            "BERTFLOW_NNODES": "2",
            "BERTFLOW_NODE_RANK": str(rank),
            "BERTFLOW_RDZV_ENDPOINT": endpoint,
            "BERTFLOW_RDZV_ID": "t",
        }
        with open(tmp_path / f"node{rank}.log", "w") as out:
            codes[rank] = launch_pretrain(spec(examples, tmp_path / "two"), nproc=1, env=env, output=out, grace_s=10)

    threads = [threading.Thread(target=node, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    logs = "\n".join((tmp_path / f"node{r}.log").read_text()[-2000:] for r in (0, 1))
    assert codes == {0: 0, 1: 0}, logs
    ref = torch.load(one_node / "rank0.weights.pt")
    for rank in (0, 1):  # node r ran global rank r
        w = torch.load(two_nodes / f"rank{rank}.weights.pt")
        for k in ref:
            torch.testing.assert_close(w[k], ref[k], atol=1e-6, rtol=0, msg=k)
    assert (two_nodes / "rank0.txt").read_text() == (one_node / "rank0.txt").read_text()  # same data per rank
