"""What checkpointing one stateful operator gives (:mod:`.checkpointing`, :mod:`.first_version`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.state.handles import OperatorSnapshot, StateHandle
from airflow_provider_checkpoint.state.keygroups import index_for_key_group

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from airflow_provider_checkpoint.dataflow.driver_rows import DriverRows, LazyFrame


@dataclass(frozen=True)
class OperatorCheckpoint:
    """What checkpointing an operator gave: its snapshot, its output (a :class:`LazyFrame` when the driver merged
    it: its DataFrame made only if a consumer asks), and metrics for the ack; ``in_driver``: the output's rows
    when the driver holds them too (merged there); ``output_rows``: how many rows the output has, when known."""

    snapshot: OperatorSnapshot
    output: DataFrame | LazyFrame
    metrics: dict[str, int]
    in_driver: DriverRows | None = None
    output_rows: int | None = None


def full_version_metrics(snapshot: OperatorSnapshot) -> dict[str, int]:
    """The ack metrics of a checkpoint that wrote ``snapshot`` in full."""
    metrics = {"state_rows": snapshot.rows, "state_bytes": snapshot.size, "state_files": len(snapshot.handles)}
    if snapshot.inline is not None:
        metrics["state_inline"] = 1
    return {**metrics, "state_size": snapshot.size}


def range_of(handle: StateHandle, max_parallelism: int, parallelism: int) -> int:
    """The index of the key-group range, of ``parallelism``, that holds ``handle``'s key groups."""
    assert handle.key_groups is not None
    return index_for_key_group(max_parallelism, parallelism, handle.key_groups[0])
