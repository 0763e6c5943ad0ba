"""The version of a pipeline's definition: a digest that changes when anything that decides its Spark plans does.

The trigger checks a pipeline's plans once per version (:mod:`airflow_provider_checkpoint.spark.dry_run`)
and records the version that passed in the job record. The digest covers the topology
(:meth:`~.planner.PipelineGraph.topology`) and every node's public settings: declared schemas,
keys, aggregates, sink targets and modes, and the code of the functions a node runs (a
``Transform``'s ``fn``: its bytecode, constants and names, so editing the function makes a new
version). It is the same in every process that parses the same DAG file with the same Python,
so a pipeline is not checked again by every task or worker. Values a node learns while it runs
(private attributes, the job a sink is bound to) are left out.
"""

from __future__ import annotations

import datetime
import decimal
import enum
import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.dataflow.graph import Node
from airflow_provider_checkpoint.exceptions import PipelineCheckError

if TYPE_CHECKING:
    from airflow_provider_checkpoint.core.job_record import JobRecord
    from airflow_provider_checkpoint.dataflow.planner import PipelineGraph

log = logging.getLogger(__name__)

_RUNTIME = frozenset({"inputs", "job_id", "job_storage"})
"""Public node attributes that are not settings: the inputs (in the topology), the bound job and its storage."""
_DEPTH = 4


def _code(code: Any) -> Any:
    """A code object as stable values: bytecode, names and constants (nested functions' code too)."""
    consts = [_code(c) if hasattr(c, "co_code") else _value(c, 0) for c in code.co_consts]
    return {"code": code.co_code.hex(), "names": list(code.co_names), "consts": consts}


_DATA = (type(None), bool, int, float, str, list, tuple, dict, set, frozenset, datetime.timedelta, datetime.date)


def _function(function: Any, depth: int) -> dict[str, Any]:
    """A function's code, and the plain data it reads from its module (constants) and its closure."""
    code = function.__code__
    names = getattr(function, "__globals__", {})
    read = {n: names[n] for n in code.co_names if n in names and isinstance(names[n], _DATA)}
    cells = []
    for cell in function.__closure__ or ():
        try:
            cells.append(cell.cell_contents)
        except ValueError:  # an empty cell
            cells.append(None)
    return {
        **_code(code),
        "globals": {n: _value(v, depth + 1) for n, v in sorted(read.items())},
        "closure": [_value(v, depth + 1) if isinstance(v, _DATA) else type(v).__qualname__ for v in cells],
    }


def _value(value: Any, depth: int) -> Any:
    """``value`` as JSON values that are the same in every process: nodes by uid, functions by their code,
    plain objects by their public attributes, anything else by its type's name."""
    if isinstance(value, Node):
        return {"node": value.uid}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, datetime.timedelta | datetime.date | datetime.time | decimal.Decimal | enum.Enum):
        return repr(value)
    if depth >= _DEPTH:
        return type(value).__qualname__
    if isinstance(value, dict):
        return {str(k): _value(v, depth + 1) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, list | tuple):
        return [_value(v, depth + 1) for v in value]
    if isinstance(value, set | frozenset):
        return sorted(map(str, value))
    function = value if hasattr(value, "__code__") else getattr(value, "func", None)  # or a functools.partial
    if hasattr(function, "__code__"):
        return {"function": getattr(value, "__qualname__", type(value).__qualname__), **_function(function, depth)}
    pattern = getattr(value, "pattern", None)
    if isinstance(pattern, str):  # a compiled regular expression
        return {"pattern": pattern}
    attributes = getattr(value, "__dict__", None)
    if isinstance(attributes, dict) and not isinstance(value, type):
        return {type(value).__qualname__: _public(attributes, depth + 1)}
    return type(value).__qualname__


def _public(attributes: dict[str, Any], depth: int) -> dict[str, Any]:
    return {k: _value(v, depth) for k, v in sorted(attributes.items()) if not k.startswith("_") and k not in _RUNTIME}


def node_definition(node: Node) -> dict[str, Any]:
    """What of ``node`` decides its plan, beyond the topology: its class and public settings."""
    return {"class": f"{type(node).__module__}.{type(node).__qualname__}", **_public(vars(node), 0)}


def pipeline_version(graph: PipelineGraph) -> str:
    """The version of ``graph``'s definition: 16 hex digits of a SHA-256 over the topology and every node's
    :func:`node_definition`."""
    document = {
        "topology": graph.topology(),
        "nodes": {uid: node_definition(node) for uid, node in sorted(graph.nodes.items())},
    }
    text = json.dumps(document, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class VersionCheck:
    """The pipeline check of one version of the pipeline's definition: ``run`` returns its problems (each
    printable, naming its node and a fix), empty when it passes."""

    version: str
    run: Callable[[], Sequence[object]]

    def apply(self, job: JobRecord) -> None:
        """Run the check unless ``job`` records this version as passed; problems refuse the checkpoint with
        :class:`PipelineCheckError` (nothing allocated yet); a pass is recorded in ``job``."""
        if job.checked_version == self.version:
            return
        problems = self.run()
        if problems:
            for problem in problems:
                log.error("pipeline check of job %s, version %s: %s", job.job_id, self.version, problem)
            listed = " | ".join(f"{i}) {p}" for i, p in enumerate(problems, 1))
            raise PipelineCheckError(
                f"version {self.version} of the pipeline of job {job.job_id} fails the pipeline check with "
                f"{len(problems)} problem(s), so no checkpoint was started: {listed}"
            )
        log.info("version %s of the pipeline of job %s passed the pipeline check", self.version, job.job_id)
        job.checked_version = self.version
