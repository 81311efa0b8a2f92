"""The served model's request limits and input shapes (``flows/served_model.py``).

The fast tests call the pyfunc's input reader directly; the slow one serves a tiny model with
``mlflow models serve`` and sends what an attacker would: a 20 MB string, too many texts, numbers,
nested lists and null, and checks the answers and the worker's peak memory.
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pandas as pd
import pytest
from tiny_bert import tiny_bert_config

from flows.served_model import (
    ENV_MAX_BATCH,
    ENV_MAX_CHARS,
    ENV_MAX_SECONDS,
    ENV_SERVER_TIMEOUT,
    ENV_SERVING,
    Budget,
    RequestAbandoned,
    RequestRefused,
    limit_from_env,
    seconds_from_env,
    texts_of,
)


@pytest.mark.parametrize(
    "request_",
    [
        "one text",
        np.array("one text"),  # {"inputs": "one text"}: MLflow hands over a 0-d array
        ["one text"],
        np.array(["one text"]),
        pd.DataFrame({"text": ["one text"], "id": [7]}),
        {"text": ["one text"]},
    ],
)
def test_every_request_shape_gives_its_texts(request_):
    assert texts_of(request_) == ["one text"]


@pytest.mark.parametrize(
    ("request_", "named"),
    [
        (np.array([1, 2]), "text 0 is int64"),
        ([1.5], "text 0 is float"),
        (np.array([["x"]]), "of shape (1, 1)"),
        ([["x"]], "text 0 is list"),
        (np.array(["a", None], dtype=object), "text 1 is NoneType"),
        (pd.DataFrame({"text": [3]}), "text 0 is int"),
        # what the signature's check leaves of columns (id, text): the ids, which are not the texts
        (pd.DataFrame({"id": ["a7"]}), "the request's column is 'id', not 'text'"),
        (None, "the request is NoneType"),
        ([], "holds no text"),
        ("x" * 20_001, "text 0 has 20,001 characters, more than the limit of 20,000 (BERTFLOW_SERVE_MAX_CHARS)"),
        (["x"] * 65, "holds 65 texts, more than the limit of 64 a request (BERTFLOW_SERVE_MAX_BATCH)"),
    ],
)
def test_what_is_not_text_or_beyond_the_limits_is_refused(request_, named):
    with pytest.raises(RequestRefused) as refused:
        texts_of(request_)
    assert named in str(refused.value)


def test_the_limits_are_read_from_the_environment(monkeypatch):
    monkeypatch.setenv(ENV_MAX_CHARS, "100")
    assert limit_from_env(ENV_MAX_CHARS, 20_000) == 100
    monkeypatch.setenv(ENV_MAX_BATCH, "0")
    with pytest.raises(ValueError, match="BERTFLOW_SERVE_MAX_BATCH='0': expected a positive whole number"):
        limit_from_env(ENV_MAX_BATCH, 64)
    monkeypatch.delenv(ENV_MAX_BATCH)
    assert limit_from_env(ENV_MAX_BATCH, 64) == 64


def test_a_request_is_abandoned_once_its_seconds_are_spent():
    now = [100.0]
    budget = Budget(3, clock=lambda: now[0])
    budget.check("text 0 of 1 at window 0 of 9")  # no time spent
    now[0] = 103.0
    budget.check("text 0 of 1 at window 5 of 9")  # exactly its seconds: still within
    now[0] = 103.5
    spent = r"abandoned after 3\.5 s, past its 3 s .* with text 0 of 1 at window 6 of 9"
    with pytest.raises(RequestAbandoned, match=spent):
        budget.check("text 0 of 1 at window 6 of 9")
    Budget(None, clock=lambda: now[0] * 1000).check("anything")  # no limit: never abandoned


def test_the_time_limit_follows_the_scoring_server_only_when_served(monkeypatch):
    for name in (ENV_MAX_SECONDS, ENV_SERVER_TIMEOUT, ENV_SERVING):
        monkeypatch.delenv(name, raising=False)
    assert seconds_from_env() is None  # predict in process: runs to its end
    monkeypatch.setenv(ENV_SERVING, "true")
    assert seconds_from_env() == 60  # MLflow's default timeout
    monkeypatch.setenv(ENV_SERVER_TIMEOUT, "7")
    assert seconds_from_env() == 7
    monkeypatch.setenv(ENV_MAX_SECONDS, "2")
    assert seconds_from_env() == 2  # ours wins
    monkeypatch.delenv(ENV_SERVING)
    assert seconds_from_env() == 2  # and holds in process too
    monkeypatch.setenv(ENV_MAX_SECONDS, "soon")
    with pytest.raises(ValueError, match="BERTFLOW_SERVE_MAX_SECONDS='soon'"):
        seconds_from_env()


# -- served for real ---------------------------------------------------------------------------------
def _tiny_pyfunc(tmp_path) -> str:
    """A tiny random BERT with a WordPiece vocabulary, saved as the registered model is logged."""
    import mlflow
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    from flows.mlflow_model import INPUT_EXAMPLE, SERVED_MODEL, _package_dir, signature
    from model.bert import BertForPreTraining
    from model.export import save_pretrained

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz", "the", "river"]
    vocab += [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"]
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    (tmp_path / "vocab").mkdir()
    (tmp_path / "vocab" / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok.save(str(tmp_path / "vocab" / "tokenizer.json"))
    torch.manual_seed(0)
    config = tiny_bert_config(vocab_size=len(vocab))
    save_pretrained(BertForPreTraining(config), str(tmp_path / "hf"), vocab_url=str(tmp_path / "vocab"))
    path = str(tmp_path / "pyfunc")
    mlflow.pyfunc.save_model(path, python_model=SERVED_MODEL, artifacts={"hf_model": str(tmp_path / "hf")},
                             code_paths=[_package_dir("model"), _package_dir("pipeline")],
                             signature=signature(), input_example=INPUT_EXAMPLE)  # fmt: skip
    return path


def _tree_peak_rss(pid: int) -> int:
    """The largest peak RSS (VmHWM, bytes) among ``pid`` and its descendants."""
    peak, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]) * 1024)
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return peak


def _post(port: int, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/invocations", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            return exc.code, json.loads(body)
        except ValueError:  # the scoring server's 504 says it in plain words
            return exc.code, {"message": body.decode(errors="replace")}


def _serve(path: str, log: str, **env: str) -> tuple[subprocess.Popen, int]:
    """``mlflow models serve`` of ``path`` with one worker, answering on a free port, its output in ``log``."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", **env}
    cmd = [sys.executable, "-m", "mlflow", "models", "serve", "-m", path, "--env-manager", "local",
           "-h", "127.0.0.1", "-p", str(port), "-w", "1"]  # fmt: skip
    with open(log, "wb") as out:
        server = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 300
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2):
                return server, port
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                os.killpg(server.pid, 15)
                raise AssertionError(open(log, errors="replace").read()[-3000:]) from None
            time.sleep(1)


def _tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its descendants (their threads included)."""
    total, todo, tick = 0.0, [pid], os.sysconf("SC_CLK_TCK")
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return total


@pytest.mark.production
@pytest.mark.slow
def test_a_request_past_the_server_timeout_stops_working_after_its_504(tmp_path):
    path = _tiny_pyfunc(tmp_path)
    # 4 MB of text within a raised length limit: about 26,000 windows, a minute or more of work
    log = tmp_path / "serve.log"
    server, port = _serve(path, log, **{ENV_SERVER_TIMEOUT: "3", ENV_MAX_CHARS: "5000000"})
    try:
        status, _ = _post(port, json.dumps({"inputs": "the river " * 400_000}).encode())
        assert status == 504  # the scoring server gave up on it (once the tokeniser let go of the GIL) ...
        deadline = time.monotonic() + 120  # ... and the model, between two windows, soon after
        while "request abandoned after" not in log.read_text(errors="replace"):
            # before the model kept its own clock the work went on to its end, a core's minutes here
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(1)
        said = log.read_text(errors="replace")
        assert "bertflow served model: request abandoned after" in said and "with text 0 of 1 at window" in said
        before = _tree_cpu_seconds(server.pid)
        time.sleep(3)
        spent = _tree_cpu_seconds(server.pid) - before
        assert spent < 0.5, f"the server used {spent:.1f} CPU-s in 3 s after abandoning the request"
        status, answer = _post(port, json.dumps({"inputs": ["the [MASK]"]}).encode())
        assert status == 200 and answer["predictions"][0]["text"] == "the [MASK]"
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=60)


@pytest.mark.production
@pytest.mark.slow
def test_mlflow_models_serve_refuses_oversize_and_non_text_requests_with_flat_memory(tmp_path):
    path = _tiny_pyfunc(tmp_path)
    server, port = _serve(path, tmp_path / "serve.log")
    try:
        status, answer = _post(port, json.dumps({"inputs": "the river"}).encode())  # a lone string answers
        assert status == 200 and answer["predictions"][0]["text"] == "the river"
        status, answer = _post(port, json.dumps({"inputs": ["the [MASK]", "river"]}).encode())
        assert status == 200 and len(answer["predictions"]) == 2
        before = _tree_peak_rss(server.pid)

        huge = json.dumps({"inputs": "the river " * 2_000_000}).encode()  # 20 MB of text, one string
        for _ in range(3):
            status, answer = _post(port, huge)
            assert status == 400, answer
            assert (
                "has 20,000,000 characters, more than the limit of 20,000 (BERTFLOW_SERVE_MAX_CHARS)"
                in (answer["stack_trace"])
            )
        peak = _tree_peak_rss(server.pid)
        # unbounded, one such request took the worker from 676 to 2,115 MiB (52,910 windows)
        assert peak - before < 400 << 20, f"peak RSS {before >> 20} -> {peak >> 20} MiB"

        for body, named in (
            ({"inputs": ["x"] * 65}, "holds 65 texts, more than the limit of 64"),
            ({"inputs": [1, 2]}, "text 0 is int"),  # the registered signature casts nothing
            ({"inputs": [[["x"]]]}, "text 0 is list"),
            ({"dataframe_split": {"columns": ["text"], "data": [[1.5]]}}, "text 0 is float"),
            ({"dataframe_split": {"columns": ["text"], "data": [[None]]}}, "text 0 is NoneType"),
            # the signature's check hands the model the first column only: the ids, not answered as texts
            ({"dataframe_split": {"columns": ["id", "text"], "data": [["a7", "the river"]]}}, "column is 'id'"),
        ):
            status, answer = _post(port, json.dumps(body).encode())
            assert status == 400 and named in answer["stack_trace"], (body, answer)
        status, answer = _post(port, json.dumps({"inputs": None}).encode())  # refused by MLflow's own parser
        assert status == 400 and "NoneType" in answer["message"], answer
        status, answer = _post(port, json.dumps({"inputs": [["the river"]]}).encode())  # one text a row
        assert status == 200 and answer["predictions"][0]["text"] == "the river"
        body = {"dataframe_split": {"columns": ["text", "id"], "data": [["the river", "a7"]]}}  # 'text' first
        status, answer = _post(port, json.dumps(body).encode())
        assert status == 200 and answer["predictions"][0]["text"] == "the river"
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=60)
