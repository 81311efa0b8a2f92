"""The import directions of the design map, enforced on every module of ours.

pipeline/ never imports Prefect, MLflow, torch or our other packages; model/ imports, of ours,
only pipeline.schema; tasks/ imports model/ but never Prefect, MLflow, Beam or pipeline/;
synth/ (test data) imports none of the stage packages; package __init__ files import nothing.
Lazy imports inside functions count too.
"""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

RULES = {  # package -> (forbidden top-level modules, allowed exceptions)
    "pipeline": ({"prefect", "mlflow", "torch", "torch_xla", "flows", "model", "tasks", "synth"}, set()),
    "model": ({"prefect", "mlflow", "apache_beam", "flows", "tasks", "synth", "pipeline"}, {"pipeline.schema"}),
    "tasks": ({"prefect", "mlflow", "apache_beam", "flows", "pipeline", "synth"}, set()),
    "synth": ({"prefect", "mlflow", "torch", "apache_beam", "flows", "model", "tasks", "pipeline"}, set()),
}


def imports_of(source: str) -> list[tuple[int, str]]:
    """(line, dotted module) of every absolute import, ``from a import b`` giving ``a.b``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def violations(package: str, source: str) -> list[str]:
    forbidden, allowed = RULES[package]
    bad = []
    for line, name in imports_of(source):
        if name.split(".")[0] in forbidden and not any(name == a or name.startswith(a + ".") for a in allowed):
            bad.append(f"line {line}: {name}")
    return bad


def test_the_checker_catches_lazy_and_from_imports():
    source = "import os\ndef f():\n    from mlflow import log_metric\n    import torch.nn\n"
    assert violations("pipeline", source) == ["line 3: mlflow.log_metric", "line 4: torch.nn"]
    assert violations("model", "from pipeline.schema import Manifest\nfrom pipeline import schema\n") == []
    assert violations("model", "from pipeline.masking import VocabIds\n") == ["line 1: pipeline.masking.VocabIds"]


@pytest.mark.parametrize("package", sorted(RULES))
def test_import_directions(package):
    files = sorted((REPO / package).rglob("*.py"))
    assert files, package
    bad = {str(f.relative_to(REPO)): v for f in files if (v := violations(package, f.read_text()))}
    assert not bad, f"imports against the design map: {bad}"


@pytest.mark.parametrize("package", ["pipeline", "model", "tasks", "flows", "synth"])
def test_package_init_files_import_nothing(package):
    init = REPO / package / "__init__.py"
    assert not imports_of(init.read_text()), f"{init} imports eagerly"
