"""The import directions of the design map and no import circles, enforced on every module of ours.

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
    assert violations("model", "from pipeline.examples.masking import VocabIds\n") == [
        "line 1: pipeline.examples.masking.VocabIds"
    ]


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


# -- no import circles, even lazy ones ----------------------------------------------------------------
def module_graph(files: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the modules of ``files`` (name -> source) it imports, anywhere in its body
    (``from a import b`` counts ``a`` and, when it is a module, ``a.b``)."""
    graph: dict[str, set[str]] = {m: set() for m in files}
    for module, source in files.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                graph[module].update(a.name for a in node.names if a.name in files)
            elif isinstance(node, ast.ImportFrom) and node.module:
                base = node.module if node.level == 0 else ".".join(module.split(".")[: -node.level] + [node.module])
                if base in files:
                    graph[module].add(base)
                graph[module].update(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in files)
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_circle_finder_sees_lazy_and_relative_imports():
    files = {
        "p.a": "from p import b\n",  # a -> p.b
        "p.b": "def f():\n    from .c import x\n",  # b -> p.c, lazily and relatively
        "p.c": "import p.a\n",  # c -> a: a circle of three
        "p.d": "from p.c import y\n",  # d -> c: outside the circle
        "p": "",
    }
    assert import_circles(module_graph(files)) == [["p.a", "p.b", "p.c"]]
    files["p.c"] = "import os\n"
    assert import_circles(module_graph(files)) == []


def test_no_module_of_ours_imports_one_that_imports_it_back():
    files = {}
    for package in ("flows", "pipeline", "model", "tasks", "synth"):
        for path in sorted((REPO / package).rglob("*.py")):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            files[name.removesuffix(".__init__")] = path.read_text()
    assert len(files) > 100
    assert import_circles(module_graph(files)) == []


def test_no_file_is_too_long_to_read_in_one_sitting():
    long = {
        str(p.relative_to(REPO)): n
        for package in ("flows", "pipeline", "model", "tasks", "synth", "benchmarks")
        for p in (REPO / package).rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 650
    }
    assert not long, f"split these by responsibility: {long}"


def objective_name_uses(files: dict[str, str], names: set[str]) -> list[str]:
    """``file:line`` of every string constant that is exactly an objective's name."""
    return [
        f"{path}:{node.lineno}"
        for path, source in files.items()
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
    ]


def test_the_objective_checker_sees_a_name_outside_the_table():
    files = {"a.py": 'x = get_objective("sop")\n', "b.py": 'y = f"{name}_loss"\nz = "sop_loss"\n'}
    assert objective_name_uses(files, {"sop", "mlm"}) == ["a.py:1"]


def test_objective_names_appear_in_their_table_only():
    """Adding an objective is a builder function and a row of pipeline/schema/objectives.py: no
    other module of ours names one (they read the row: columns, heads, losses)."""
    from pipeline.schema.objectives import OBJECTIVES

    table = "pipeline/schema/objectives.py"
    files = {
        str(p.relative_to(REPO)): p.read_text()
        for package in ("flows", "pipeline", "model", "tasks", "synth")
        for p in sorted((REPO / package).rglob("*.py"))
    }
    assert objective_name_uses({table: files[table]}, set(OBJECTIVES))  # the table itself does
    assert [u for u in objective_name_uses(files, set(OBJECTIVES)) if not u.startswith(table + ":")] == []
