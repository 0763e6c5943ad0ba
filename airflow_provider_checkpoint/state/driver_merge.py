"""Incremental checkpoints of a small keyed state, merged on the driver with pyarrow.

For an operator with a per-key partial form of its input (:meth:`StatefulOperator.partials`,
e.g. :class:`~airflow_provider_checkpoint.dataflow.stateful.KeyedAggregate`) whose restored
state has at most ``driver_merge_rows`` rows (a checkpoint setting), one Spark action reads
the checkpoint's input, reduces it to one row per key tagged with its key-group range, and collects it as Arrow. The
driver reads the touched ranges' state files, merges (:meth:`StatefulOperator.merge_arrow`) and
writes the deltas and compacted ranges itself: no shuffle of the state, no Spark write job.
Files, handles and layout are those the Spark path writes, so each continues the other's
checkpoints, and a step retried on either path produces the same state.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.dataflow.driver_rows import KEY_HASH, DriverRows, key_hash
from airflow_provider_checkpoint.dataflow.operator import NEW, StatefulOperator
from airflow_provider_checkpoint.state.files import DELETED, merged_rows, overlay, write_state_file
from airflow_provider_checkpoint.state.handles import OperatorSnapshot, StateHandle
from airflow_provider_checkpoint.state.incremental import FULL_VERSION_SHARE, StateLayout
from airflow_provider_checkpoint.state.spark_backend import SEQ, range_index, state_schema
from airflow_provider_checkpoint.storage import Location

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

DRIVER_INPUT_BYTES = 64 << 20
"""The largest input (Spark's size estimate) whose per-key partials the driver collects."""
_RANGE = "__kgr"
_ARROW_MERGEABLE = {"string", "byte", "short", "integer", "long", "boolean", "date", "timestamp", "timestamp_ntz"}
_ARROW_MERGEABLE |= {"decimal"}
"""Spark types (``typeName``) of state columns pyarrow groups, sums and compares as Spark does
(not floating point: Spark orders NaN above every number, pyarrow skips it)."""


def driver_partials(
    node: StatefulOperator, inputs: Mapping[str, DataFrame], restored: OperatorSnapshot, max_rows: int
) -> DataFrame | None:
    """The input's per-key partials (:meth:`StatefulOperator.partials`) when this checkpoint of
    ``node`` is merged on the driver: its state has at most ``max_rows`` rows of simple types and
    its input is small (by Spark's estimate; none over Spark Connect). ``None``: Spark merges."""
    partials = node.partials(inputs) if restored.rows <= max_rows else None
    if partials is None:
        return None
    if any(f.dataType.typeName() not in _ARROW_MERGEABLE for f in state_schema(restored).fields):
        return None  # e.g. a struct key: pyarrow cannot group by it
    sizes = [_estimated_bytes(df) for df in inputs.values()]
    small = all(size is not None for size in sizes) and sum(s or 0 for s in sizes) <= DRIVER_INPUT_BYTES
    return partials if small else None


def _estimated_bytes(df: DataFrame) -> int | None:
    """Spark's estimate of ``df``'s size (its optimized plan's statistics); ``None`` if unknown."""
    jdf = getattr(df, "_jdf", None)  # a Spark Connect DataFrame has no JVM side here
    return None if jdf is None else int(str(jdf.queryExecution().optimizedPlan().stats().sizeInBytes()))


def merge_on_driver(
    storage: Location,
    directory: str,
    checkpoint_id: int,
    node: StatefulOperator,
    partials: DataFrame,
    restored: OperatorSnapshot,
    layout: StateLayout,
    fault: Callable[[str], None],
) -> tuple[OperatorSnapshot, DataFrame, dict[str, int], DriverRows | None]:
    """Merge this checkpoint's input, its per-key ``partials`` (:func:`driver_partials`), into
    ``restored`` and write the deltas (and the ranges :meth:`StateLayout.to_compact` picks, or
    every range when most keys changed) under ``directory``: the new snapshot, the new rows of
    the changed keys (as a DataFrame, :meth:`StatefulOperator.output_of`), the ack metrics, and that output as
    the driver holds it (``None`` where only Spark computes it)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql.pandas.types import to_arrow_schema

    spark = partials.sparkSession
    struct = state_schema(restored)
    schema = to_arrow_schema(struct, timezone="UTC")
    columns = schema.names
    batch = partials.withColumns(
        {_RANGE: range_index(node.keys, node.max_parallelism, layout.parallelism), KEY_HASH: key_hash(node.keys)}
    ).toArrow()
    touched = {int(i) for i in pc.unique(batch[_RANGE]).to_pylist()}
    compact = set(layout.to_compact())
    if not layout.has_deltas and len(batch) >= FULL_VERSION_SHARE * restored.rows:
        compact = set(range(layout.parallelism))  # a delta that large would make every range due
    state: dict[int, pa.Table] = {
        i: merged_rows(storage, restored, layout.ranges[i].handles, node.uid).cast(schema)
        for i in sorted(touched | compact)
    }
    rows = [t.append_column(_RANGE, pa.array(np.full(len(t), i, np.int32))) for i, t in state.items()]
    merged = node.merge_arrow(
        pa.concat_tables(rows) if rows else schema.empty_table(), batch.cast(_with_range(schema, batch))
    )

    def changes_in(i: int) -> pa.Table:
        own = merged.filter(pc.equal(merged[_RANGE], i)).select(columns)
        return own.append_column(DELETED, pa.array(np.zeros(len(own), np.bool_))).append_column(
            SEQ, pa.array(np.full(len(own), checkpoint_id, np.int64))
        )

    fault("step.before_state_write")
    written: dict[int, list[StateHandle]] = {}
    for i in sorted(touched - compact):
        span = layout.ranges[i].key_groups
        written[i] = [write_state_file(storage, _file(directory, "delta", i), changes_in(i), span, checkpoint_id)]
    compacted: dict[int, list[StateHandle]] = {}
    if compact:
        fault("step.during_compaction")
    for i in sorted(compact):
        full = overlay(state[i], changes_in(i), node.keys)
        span = layout.ranges[i].key_groups
        compacted[i] = [write_state_file(storage, _file(directory, "compacted", i), full, span)] if len(full) else []
    fault("step.after_state_write")
    inserted = int(pc.sum(merged[NEW]).as_py() or 0)
    snapshot = OperatorSnapshot(
        handles=layout.handles_after(written, compacted),
        schema=restored.schema,
        keys=node.keys,
        max_parallelism=node.max_parallelism,
        rows=restored.rows + inserted,
    )
    new_files = [h for hs in (*written.values(), *compacted.values()) for h in hs]
    metrics = {
        "state_rows": snapshot.rows,
        "state_bytes": sum(h.size for h in new_files),
        "state_files": len(new_files),
        "state_keys_changed": len(merged),
        "state_ranges_compacted": len(compact),
        "state_size": snapshot.size,
        "state_merged_on_driver": 1,
        "state_incremental": 1,
    }
    new_rows = merged.select(columns)
    shown = node.output_arrow(new_rows)
    held = None if shown is None else DriverRows(shown.append_column(KEY_HASH, merged[KEY_HASH]), node.keys)
    return snapshot, node.output_of(spark.createDataFrame(new_rows, schema=struct)), metrics, held


def _with_range(schema: pa.Schema, batch: pa.Table) -> pa.Schema:
    """``batch``'s schema with the state's column types (e.g. no large strings)."""
    import pyarrow as pa

    return pa.schema([schema.field(f.name) if f.name in schema.names else f for f in batch.schema])


def _file(directory: str, kind: str, index: int) -> str:
    return f"{directory}/{kind}/kgr={index}/part-{uuid.uuid4().hex}.parquet"
