"""The registered model works where bertflow is not installed: a fresh venv with only MLflow and the
model's declared requirements loads it from the registry and serves it over HTTP.

Slow tier (``python3 -m pytest -m slow tests/flows/test_served_model_slow.py``): it builds a venv
(pip from the package registry; torch from this machine's wheels) and the tiny chain.
"""

import json
import os
import subprocess
import sys
import urllib.request

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory, chain):
    """A venv holding MLflow and the champion's requirements.txt, and not bertflow."""
    import mlflow

    root = chain[0]
    uri = f"sqlite:///{root}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    local = mlflow.artifacts.download_artifacts("models:/bert-tiny@champion")
    requirements = open(os.path.join(local, "requirements.txt")).read().split()
    assert not any(r.startswith(("bertflow", "transformers")) for r in requirements), requirements
    venv = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-r", os.path.join(local, "requirements.txt")]
    out = subprocess.run(pip, capture_output=True, text=True, timeout=1500)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return venv, uri


def _bare_python(venv, code, uri, tmp_path):
    env = {"PATH": f"{venv}/bin:/usr/bin:/bin", "MLFLOW_TRACKING_URI": uri, "MLFLOW_DISABLE_TELEMETRY": "true",
           "HOME": str(tmp_path)}  # fmt: skip
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def test_the_champion_loads_and_predicts_without_bertflow(bare_venv, tmp_path):
    venv, uri = bare_venv
    missing = _bare_python(venv, "import flows", uri, tmp_path)
    assert missing.returncode != 0 and "No module named 'flows'" in missing.stderr  # bertflow is not here
    code = (
        "import json, mlflow, pandas as pd\n"
        "m = mlflow.pyfunc.load_model('models:/bert-tiny@champion')\n"
        "a = m.predict(pd.DataFrame({'text': ['the [MASK] of the river']}))\n"
        "b = m.predict(['the [MASK] of the river'])\n"
        "c = m.predict('the [MASK] of the river')\n"
        "print(json.dumps([list(x['filled'][0]) for x in (a, b, c)] + [len(a['cls_embedding'][0])]))\n"
    )
    out = _bare_python(venv, code, uri, tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]
    a, b, c, hidden = json.loads(out.stdout.strip().splitlines()[-1])
    assert a == b == c and len(a) == 1 and hidden == 128


def test_mlflow_models_serve_answers_without_bertflow(bare_venv, servers, tmp_path):
    venv, uri = bare_venv
    port = servers.free_port()
    env = {"PATH": f"{venv}/bin:/usr/bin:/bin", "MLFLOW_TRACKING_URI": uri, "MLFLOW_DISABLE_TELEMETRY": "true",
           "HOME": str(tmp_path)}  # fmt: skip
    cmd = [str(venv / "bin" / "mlflow"), "models", "serve", "-m", "models:/bert-tiny@champion", "--env-manager",
           "local", "-h", "127.0.0.1", "-p", str(port)]  # fmt: skip
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        servers.wait_until_healthy(
            f"http://127.0.0.1:{port}/ping", server, 240, log=log_path, what="mlflow models serve"
        )
        answers = []
        for body in ({"inputs": ["the [MASK] of the river"]},
                     {"dataframe_split": {"columns": ["text"], "data": [["the [MASK] of the river"]]}}):  # fmt: skip
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/invocations", data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )  # fmt: skip
            with urllib.request.urlopen(request, timeout=60) as r:
                answers.append(json.loads(r.read())["predictions"])
        assert answers[0] == answers[1] and len(answers[0][0]["filled"]) == 1
    finally:
        server.terminate()
        server.wait(timeout=30)
