"""The tiny run's figures quoted in README.md and docs/ are what ``benchmarks/tiny_figures.py``
prints for a run of the bundled sample.

The default tier reads the shared chain's root (``conftest.chain``: the tiny preset with shorter
pretraining and fine-tuning, the data stages as the preset has them): the README's data-stage
sentence and the corpus and vocab lines of its ``bertflow status`` example must equal the script's,
on any machine. Training figures (losses, dev scores) are bit-for-bit equal only on the CPU they
were measured on (another vector width sums in another order: the script's docstring), so
docs/downstream.md's end-to-end table is compared where the machine is the one it names. The slow
tier runs the tiny preset itself and compares every sentence of the README's paragraph.
"""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("tiny_figures", REPO / "benchmarks" / "tiny_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _flat(text: str) -> str:
    return " ".join(text.split())


def _readme_status_block() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = text.split("$ bertflow status --set pretrain.learning_rate=5e-4\n", 1)[1].split("```", 1)[0]
    return [ln for ln in block.splitlines()[1:] if ln.strip() and not ln.strip().startswith("(plus")]


def test_the_readmes_data_figures_are_the_scripts_for_the_sample(chain):
    figures = _script()
    root = chain[0]
    readme = _flat((REPO / "README.md").read_text())
    sentence = figures.data_sentence(root)
    assert sentence in readme, sentence


def test_the_readmes_status_example_is_the_scripts(chain, chain_overrides):
    """Every stage in order, with its state and reason; the corpus and vocab lines whole (the
    other stages' figures are the tiny preset's, which the chain shortens)."""
    figures = _script()
    rows = figures.status_rows(chain[0], chain_overrides)
    readme = _readme_status_block()
    assert [ln.split()[:2] for ln in readme] == [[stage, state] for stage, state, _, _ in rows]
    for line, (stage, state, why, _) in zip(readme, rows):
        assert _flat(line).startswith(_flat(f"{stage} {state} {why}")), (line, why)
    example = figures.status_example(chain[0], chain_overrides).splitlines()[2:]
    for line, mine in zip(readme, example):
        if line.split()[0] in ("corpus", "vocab"):
            assert line == mine


def _measured_on(doc: str) -> str:
    found = re.search(r"measured on (.+?) \(`benchmarks/tiny_figures\.py`", _flat(doc))
    return found.group(1) if found else ""


def test_the_downstream_docs_end_to_end_table_is_the_chains(chain):
    """docs/downstream.md, "The tiny run, measured": the chain's results table, where the machine
    is the one the figures were measured on (elsewhere the training figures move by a row or two
    of a dev set: the script's docstring)."""
    figures = _script()
    doc = (REPO / "docs" / "downstream.md").read_text()
    where = _measured_on(doc)
    assert where, "docs/downstream.md names no machine for its tiny-run figures"
    here = figures.machine()["cpu"]
    if where != here:
        pytest.skip(f"the figures were measured on {where}; this machine is {here}")
    assert figures.results_table(chain[0]) in doc


@pytest.mark.slow
def test_every_figure_of_the_readmes_tiny_paragraph_is_the_presets(tmp_path):
    """The tiny preset itself, as the README's first command runs it: the data and examples
    sentences anywhere, the pretraining and downstream ones on the machine the README names."""
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home")}
    root = tmp_path / "tiny"
    run = subprocess.run([sys.executable, "-m", "flows.cli", "run", "--preset", "tiny", "--root", str(root)], env=env,
                         capture_output=True, text=True, timeout=3600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-5000:]
    figures = _script()
    readme = _flat((REPO / "README.md").read_text())
    for sentence in (figures.data_sentence(root), figures.examples_sentence(root)):
        assert sentence in readme, sentence
    where = _measured_on((REPO / "README.md").read_text())
    if where != figures.machine()["cpu"]:
        pytest.skip(f"the training figures were measured on {where}; this machine is {figures.machine()['cpu']}")
    for sentence in (figures.pretraining_sentence(root), *figures.downstream_sentences(root)):
        assert sentence in readme, sentence
