"""The package's layers: no module imports (at run time) from a package above its own.

``core`` ← ``storage`` ← ``state`` ← ``dataflow`` ← ``spark`` ← ``coordinator`` ←
``jobs``/``hooks`` ← the Airflow face (``operators``, ``sensors``, ``triggers``, ``plugin``,
``cli``) ← ``pipeline``. Imports under ``if TYPE_CHECKING:`` are type hints only and
allowed; imports inside functions run, so they count. ``core`` imports neither Airflow nor
Spark, not even for type hints.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = "airflow_provider_checkpoint"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE
LAYERS: dict[str, int] = {
    "exceptions": 0,
    "core": 1,
    "storage": 2,
    "state": 3,
    "dataflow": 4,
    "spark": 5,
    "coordinator": 6,
    "jobs": 7,
    "hooks": 7,
    "operators": 8,
    "sensors": 8,
    "triggers": 8,
    "plugin": 8,
    "cli": 8,
    "pipeline": 9,
    "testing": 9,
    "get_provider_info": 9,
    "": 9,  # the package's __init__ (its names load lazily)
}


def modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        found.append((".".join(parts[:-1] if parts[-1] == "__init__" else parts), path))
    return found


def layer(module: str) -> str:
    """The top-level package or module of ``module`` under the package (``""``: the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


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
        if layer(module) == "core"
        for line, target in imports(path.read_text(), type_hints=True)
        if target.split(".")[0] in ("airflow", "pyspark")
    ]
    assert not found, "core/ must stay pure Python:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f():\n    from airflow_provider_checkpoint.spark.state import merge\n", 1),
        ("import airflow_provider_checkpoint.operators.checkpoint\n", 1),
        ("if TYPE_CHECKING:\n    from airflow_provider_checkpoint.spark import x\n", 0),
        ("from airflow_provider_checkpoint.core.model import JsonDict\n", 0),
    ],
)
def test_the_check_sees_run_time_imports_only(source: str, expected: int) -> None:
    found = upward_imports(f"{PACKAGE}.dataflow.example", source)
    assert len(found) == expected, found
    assert all(f"{PACKAGE}.dataflow.example:" in bad and "is above 'dataflow'" in bad for bad in found)
