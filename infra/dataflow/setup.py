"""The Beam workers' package: ``pipeline/`` alone, with what it imports (requirements.txt).

Not the project's pyproject.toml: that one pulls torch, Prefect and MLflow, which no Beam worker
runs. Used two ways: the worker image (Dockerfile) installs it, or ``run.sh --setup-file`` copies
it next to a copy of ``pipeline/`` and passes ``--setup_file`` so that Dataflow builds an sdist
and installs it on every worker at start-up (slower starts, no image to build).
"""

from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent
requirements = [
    line.strip()
    for line in (HERE / "requirements.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]

setup(
    name="bertflow-beam-worker",
    version="0.1.0",
    description="bertflow's Beam jobs (corpus, examples) for Dataflow/Flink/Spark workers",
    packages=find_packages(include=["pipeline", "pipeline.*"]),
    install_requires=requirements,
    python_requires=">=3.11",
)
