"""What a user sees in MLflow's UI, in a real browser (production tier; `.ci/run` installs
Debian's ``chromium`` when it is missing): a real ``mlflow server`` on the store the project's
``Tracker`` wrote, pages rendered by headless Chromium (``--dump-dom`` after the app's scripts ran).

- The link every run prints (``flows.tracking.ui_url``) opens the experiment on its training runs:
  the runs table with the runs' names, not MLflow's GenAI overview.
- The experiment's plain address opens on the GenAI overview whatever the experiment's tags: MLflow
  3.17's UI takes the view from the URL or its sidebar switch only (its bundle ignores
  ``mlflow.experimentKind``). This is what the README tells users; when a MLflow release changes
  it, this test fails and the README's sentence is to be revisited.
- A registered version's page lists every tag the registration wrote.
"""

import html
import os
import re
import shutil
import subprocess

import pytest

pytestmark = [pytest.mark.production, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def page_text(url: str, profile) -> str:
    """The visible text of ``url`` once the page's scripts ran (a fresh browser profile)."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
           "--virtual-time-budget=30000", "--dump-dom", url]  # fmt: skip
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=True).stdout
    text = re.sub(r"<script.*?</script>|<style.*?</style>", " ", dom, flags=re.S)
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", text)))


@pytest.fixture(scope="module")
def store(tmp_path_factory, servers):
    """An ``mlflow server`` on a store holding what a run writes: the experiment as the project
    creates it, a parent run with stage runs, a registered version with tags."""
    if CHROMIUM is None:  # CI installs it (`.ci/run`, which sets BERTFLOW_CI): there a missing one fails
        (pytest.fail if os.environ.get("BERTFLOW_CI") else pytest.skip)("no chromium on PATH (Debian's `chromium`)")
    from flows.tracking import Tracker

    folder = tmp_path_factory.mktemp("ui-store")
    proc, url = servers.start_mlflow_server(folder)
    try:
        tracker = Tracker(url)
        experiment = tracker.use_experiment("bertflow")
        parent = tracker.start_run("pretrain-tiny")
        for stage in ("corpus", "vocab", "pretrain"):
            child = tracker.start_run(stage, parent_id=parent, tags={"bertflow.stage": stage})
            tracker.log_metrics(child, {"seconds": 1.0})
            tracker.end_run(child)
        tracker.end_run(parent)
        from mlflow import MlflowClient

        client = MlflowClient(url, url)
        client.create_registered_model("bert-tiny")
        tags = {"bertflow.score": "52.8", "lineage.corpus.fingerprint": "483e0956", "lineage.raw.wiki.dump": "enwiki-1"}
        client.create_model_version("bert-tiny", f"runs:/{parent}/model", run_id=parent, tags=tags)
        yield url, experiment, tags
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_printed_link_opens_the_training_runs(store, tmp_path):
    from flows.tracking import ui_url

    url, experiment, _ = store
    text = page_text(ui_url(url, experiment), tmp_path / "profile")
    assert "Runs - Experiment" in text, text[:1500]  # the page's title: the runs view
    assert "pretrain-tiny" in text and "matching runs" in text, text[:1500]
    assert "Latency" not in text and "Token Usage" not in text, text[:1500]  # not the GenAI overview


def test_the_plain_experiment_address_opens_mlflows_genai_overview(store, tmp_path):
    url, experiment, _ = store
    text = page_text(f"{url}/#/experiments/{experiment}", tmp_path / "profile")
    # what the README says MLflow does (the reason the printed link names the view)
    assert "Overview - Experiment" in text and "Latency" in text, text[:1500]


def test_a_registered_version_lists_its_tags(store, tmp_path):
    url, _, tags = store
    text = page_text(f"{url}/#/models/bert-tiny/versions/1", tmp_path / "profile")
    assert "bert-tiny v1" in text, text[:1500]
    for key, value in tags.items():
        assert f"{key} {value}" in text, (key, text[:3000])
