"""The package's layers, and no import cycle.

``exceptions`` ← ``core`` with the pure part of ``state`` (key groups, handles, incremental
bookkeeping) ← ``storage`` ← ``fileio`` ← ``dataflow`` ← ``connectors`` and the ``state``
backends ← ``restore`` ← ``spark`` ← ``coordinator`` ← ``jobs``/``hooks``/``metrics`` ← the Airflow face
(``operators``, ``sensors``, ``triggers``, ``plugin``, ``cli``) ← ``pipeline``. A module's
layer is that of the longest entry of :data:`LAYERS` naming it. Imports under ``if
TYPE_CHECKING:`` are type hints only and may cross layers; imports inside functions run, so
they count. No cycle among modules, type hints included. ``core`` and the pure state
modules import neither Airflow nor Spark, not even for type hints.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = "airflow_provider_checkpoint"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE
PURE = ("core", "state.keygroups", "state.handles", "state.incremental")
LAYERS: dict[str, int] = {
    "exceptions": 0,
    **dict.fromkeys(PURE, 1),
    "storage": 2,
    "fileio": 3,
    "dataflow": 4,
    "connectors": 5,
    "state": 5,
    "restore": 6,
    "spark": 7,
    "coordinator": 8,
    "completion": 8,
    "jobs": 9,
    "metrics": 9,
    "hooks": 9,
    "operators": 10,
    "sensors": 10,
    "triggers": 10,
    "plugin": 10,
    "cli": 10,
    "pipeline": 11,
    "dags": 11,
    "testing": 11,
    "get_provider_info": 11,
    "": 11,  # the package's __init__ (its names load lazily)
}


def modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        found.append((".".join(parts[:-1] if parts[-1] == "__init__" else parts), path))
    return found


def layer(module: str) -> str:
    """The longest entry of :data:`LAYERS` that names ``module`` or a package holding it (``""``: the package)."""
    parts = module.split(".")[1:]
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in LAYERS:
            return ".".join(parts[:end])
    return parts[0] if parts else ""


def imports(source: str, type_hints: bool) -> Iterator[tuple[int, str]]:
    """(line, module) of every import in ``source``; with ``type_hints`` those under ``if TYPE_CHECKING:`` too."""
    tree = ast.parse(source)
    hints: set[int] = set()
    if not type_hints:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                hints.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    for node in ast.walk(tree):
        if id(node) in hints:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)


def upward_imports(module: str, source: str) -> list[str]:
    """The run-time imports of ``module`` from a layer above its own, as ``module:line imports target``."""
    own = LAYERS[layer(module)]
    return [
        f"{module}:{line} imports {target} (layer {layer(target)!r} is above {layer(module)!r})"
        for line, target in imports(source, type_hints=False)
        if target.startswith(PACKAGE + ".") and LAYERS[layer(target)] > own
    ]


def test_every_module_has_a_layer() -> None:
    unknown = sorted({layer(m) for m, _ in modules()} - set(LAYERS))
    assert not unknown, f"add these top-level modules or packages to LAYERS: {unknown}"


def test_no_module_imports_from_a_higher_layer() -> None:
    found = [bad for module, path in modules() for bad in upward_imports(module, path.read_text())]
    assert not found, "lower layers import higher ones:\n" + "\n".join(found)


def test_core_imports_neither_airflow_nor_spark() -> None:
    found = [
        f"{module}:{line} imports {target}"
        for module, path in modules()
        if layer(module) in PURE
        for line, target in imports(path.read_text(), type_hints=True)
        if target.split(".")[0] in ("airflow", "pyspark")
    ]
    assert not found, "core/ and the pure state modules must stay pure Python:\n" + "\n".join(found)


def module_imports(source: str, known: set[str]) -> set[str]:
    """The package's modules ``source`` imports, type hints included (``from pkg import mod`` names ``pkg.mod``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if name in known else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found & known


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module, or one importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_type_hints_included() -> None:
    known = {module for module, _ in modules()}
    graph = {module: module_imports(path.read_text(), known) - {module} for module, path in modules()}
    found = cycles(graph)
    described = [
        " <-> ".join(c) + "\n    " + "; ".join(f"{a} -> {b}" for a in c for b in sorted(graph[a] & set(c)))
        for c in found
    ]
    assert not found, "import cycles:\n" + "\n".join(described)


def test_the_cycle_check_finds_a_loop_through_type_hints() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    source = "if TYPE_CHECKING:\n    from airflow_provider_checkpoint.spark import context\n"
    assert module_imports(source, {f"{PACKAGE}.spark.context"}) == {f"{PACKAGE}.spark.context"}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f():\n    from airflow_provider_checkpoint.state.spark_backend import merge\n", 1),
        ("import airflow_provider_checkpoint.operators.checkpoint\n", 1),
        ("if TYPE_CHECKING:\n    from airflow_provider_checkpoint.spark import x\n", 0),
        ("from airflow_provider_checkpoint.core.model import JsonDict\n", 0),
    ],
)
def test_the_check_sees_run_time_imports_only(source: str, expected: int) -> None:
    found = upward_imports(f"{PACKAGE}.dataflow.example", source)
    assert len(found) == expected, found
    assert all(f"{PACKAGE}.dataflow.example:" in bad and "is above 'dataflow'" in bad for bad in found)
