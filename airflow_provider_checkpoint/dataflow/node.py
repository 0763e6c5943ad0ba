"""The vertex every node of a pipeline's dataflow graph is (:class:`Node`), and the declaration context
that collects the nodes a pipeline declares (:func:`collecting`). The nodes themselves:
:mod:`.graph`, :mod:`.source`, :mod:`.sink`, :mod:`.channel`, :mod:`.operator`.

Nodes are declared at DAG-parse time and import no Spark: Spark is only touched when a
step runs. Every node has a stable ``uid`` that keys its state and its position in
checkpoints, so renaming a task or reordering code never loses state.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, ClassVar

from airflow_provider_checkpoint.core.model import JsonDict
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

if TYPE_CHECKING:
    from airflow_provider_checkpoint.core.event_time import WatermarkSpec

_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def step_name(uid: str, step: str | None) -> str | None:
    """``step``, the name of the step (Airflow task) a node runs in, if it looks like a uid."""
    if step is not None and not _UID.match(step):
        raise PipelineDefinitionError(f"{uid}: step name {step!r} must look like a uid")
    return step


class Node:
    """A vertex of the dataflow graph."""

    kind: ClassVar[str] = "node"
    feeds_nodes: ClassVar[bool] = True
    """Whether the node's records can be another node's input (a sink's cannot)."""

    def __init__(self, uid: str, inputs: Sequence[Node] = ()) -> None:
        if not _UID.match(uid):
            raise PipelineDefinitionError(
                f"uid {uid!r} must be 1-100 characters of letters, digits, '_', '.', '-' "
                "and start with a letter or digit"
            )
        self.uid = uid
        self.inputs = tuple(inputs)
        for node in self.inputs:
            if not node.feeds_nodes:
                raise PipelineDefinitionError(f"{uid}: a {node.kind} ({node.uid}) cannot be an input")
        _register(self)

    def describe(self) -> JsonDict:
        """The topology entry of this node (recorded in the job record)."""
        return {"kind": self.kind, "inputs": [n.uid for n in self.inputs]}

    def upstream_watermark(self) -> WatermarkSpec | None:
        """The watermark of this node's records, declared on the sources upstream (through transforms,
        unions that agree, and channels); ``None``: none declared, or a stateful operator in between."""
        if not self.inputs:
            return None
        specs = {n.upstream_watermark() for n in self.inputs}
        return specs.pop() if len(specs) == 1 else None

    def unique_keys(self) -> tuple[str, ...] | None:
        """Columns whose values identify at most one row of this node's output in a checkpoint;
        ``None``: not known (an upsert sink then resolves several rows per key itself)."""
        return None

    def deletes_column(self) -> str | None:
        """The boolean output column whose true value deletes the row's key (upsert Kafka tombstones), if any."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(uid={self.uid!r})"


# -- declaration context --------------------------------------------------------------
_active: list[list[Node]] = []


def _register(node: Node) -> None:
    if _active:
        _active[-1].append(node)


@contextmanager
def collecting() -> Iterator[list[Node]]:
    """Collect every node declared inside the block, in declaration order."""
    nodes: list[Node] = []
    _active.append(nodes)
    try:
        yield nodes
    finally:
        _active.pop()
