"""An operator's first state written by key-group range in the pass that computes it (by Spark, or by the driver)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.core.faults import fault_point
from airflow_provider_checkpoint.core.settings import CheckpointSettings
from airflow_provider_checkpoint.dataflow.driver_rows import KEY_HASH, DriverRows, key_hash, task_slots
from airflow_provider_checkpoint.dataflow.observation import observed_metrics
from airflow_provider_checkpoint.dataflow.operator import StatefulOperator
from airflow_provider_checkpoint.fileio.scans import as_nullable, read_parquet
from airflow_provider_checkpoint.state import driver_merge
from airflow_provider_checkpoint.state.driver_merge import ARROW_MERGEABLE, state_file
from airflow_provider_checkpoint.state.files import write_state_file
from airflow_provider_checkpoint.state.handles import OperatorSnapshot, StateHandle
from airflow_provider_checkpoint.state.incremental import ranges_for
from airflow_provider_checkpoint.state.keygroups import balanced_parallelism, coarsest_nesting, range_for_index
from airflow_provider_checkpoint.state.operator_checkpoint import OperatorCheckpoint, full_version_metrics, range_of
from airflow_provider_checkpoint.state.spark_backend import RANGE, first_state_rows, range_index, write_ranged
from airflow_provider_checkpoint.storage import Location

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame


def first_full_version(
    storage: Location,
    directory: str,
    node: StatefulOperator,
    inputs: Mapping[str, DataFrame],
    settings: CheckpointSettings,
    where: Mapping[str, object],
) -> OperatorCheckpoint | None:
    """An operator's first state (none before: a new job, a backfill) written by key-group range in the
    pass that computes it, when the operator has that form (:meth:`StatefulOperator.first_state`) and
    Spark expects more input rows than ``inline_state_threshold`` bytes; else ``None``.

    The input is shuffled once, by range, and each range's file is written by the task that aggregates
    it: nothing cached, no second shuffle, no count before. The ranges are as many as Spark's estimate
    of the input's rows needs (the state has at most as many rows), or a multiple of that which keeps
    every task slot busy (:func:`balanced_parallelism`); if the written state needs fewer, adjacent
    files share a range (:func:`coarsest_nesting`), as a later compaction finds them. The output
    (every key's row) is read back from the written files.
    """
    from pyspark.sql import Observation, Row
    from pyspark.sql import functions as F

    estimate = first_state_rows([inputs[n.uid] for n in node.inputs], settings.inline_state_threshold)
    if settings.max_inline_state is not None or estimate is None:
        return None
    max_parallelism = node.max_parallelism
    state, ranges = _ranged_first_state(node, inputs, estimate)
    if state is None:
        return None
    observation = Observation()
    observed = state.observe(observation, F.count(F.lit(1)).alias("rows"))
    fault_point("step.before_state_write", **where)
    handles = write_ranged(storage, directory, observed, max_parallelism, ranges)
    rows = int(observed_metrics(observation, lambda: None if handles else Row(rows=0))["rows"])
    handles = _grouped(handles, max_parallelism, ranges, rows)
    fault_point("step.after_state_write", **where)
    schema = as_nullable(state.drop(RANGE).schema)
    snapshot = OperatorSnapshot(tuple(handles), schema.json(), node.keys, max_parallelism, rows)
    paths, sizes = [storage.path(h.path) for h in handles], [h.size for h in handles]
    output = node.output_of(read_parquet(state.sparkSession, storage.fs, paths, schema, sizes=sizes))
    return OperatorCheckpoint(snapshot, output, full_version_metrics(snapshot), output_rows=rows)


def first_version_on_driver(
    storage: Location,
    directory: str,
    node: StatefulOperator,
    inputs: Mapping[str, DataFrame],
    settings: CheckpointSettings,
    where: Mapping[str, object],
    held: pa.Table | None = None,
) -> OperatorCheckpoint | None:
    """An operator's first state written by the driver within the bounds of a merge there
    (:func:`~.driver_merge.within_driver_bounds`, with Spark's estimates of the input's size and of the state's
    rows): aggregated as :func:`first_full_version`
    aggregates it (one shuffle by range, no partial aggregation) but collected as Arrow with Spark's hash of
    the keys, then each range's file written with pyarrow (as the driver merge writes a compacted range) and
    the output held in the driver, so an upsert sink on the same keys writes it with no Spark job. ``held``: the
    input's partials the driver computed already (:func:`~.driver_merge.held_partials`): no Spark job at all. The
    ranges, their grouping and the handles are those of :func:`first_full_version`; either continues the
    other. ``None``: not small, or not that form.
    """
    import numpy as np
    from pyspark.sql.pandas.types import to_arrow_schema

    if not node.one_row_per_key:
        return None
    frames = [inputs[n.uid] for n in node.inputs]
    estimate = first_state_rows(frames, settings.inline_state_threshold)
    if estimate is None or not driver_merge.within_driver_bounds(
        settings, estimate, lambda: driver_merge.input_size(frames), first=True
    ):
        return None
    max_parallelism = node.max_parallelism
    state, ranges = _ranged_first_state(node, inputs, estimate)
    if state is None:
        return None
    struct = as_nullable(state.drop(RANGE).schema)
    if any(f.dataType.typeName() not in ARROW_MERGEABLE for f in struct.fields):
        return None
    schema = to_arrow_schema(struct, timezone="UTC")
    if held is not None:
        batch = driver_merge.hashed(held, node.keys, max_parallelism, ranges, RANGE)
    else:
        batch = state.withColumn(KEY_HASH, key_hash(node.keys)).toArrow()
    order = np.argsort(batch[RANGE].to_numpy(), kind="stable")
    batch = batch.take(order)
    indexes, starts, counts = np.unique(batch[RANGE].to_numpy(), return_index=True, return_counts=True)
    rows = batch.select(schema.names).cast(schema)
    fault_point("step.before_state_write", **where)
    handles = [
        write_state_file(
            storage,
            state_file(directory, "compacted", int(i)),
            rows.slice(int(start), int(count)),
            range_for_index(max_parallelism, ranges, int(i)),
        )
        for i, start, count in zip(indexes, starts, counts, strict=True)
    ]
    handles = _grouped(handles, max_parallelism, ranges, len(rows))
    fault_point("step.after_state_write", **where)
    snapshot = OperatorSnapshot(tuple(handles), struct.json(), node.keys, max_parallelism, len(rows))
    paths, file_sizes = [storage.path(h.path) for h in handles], [h.size for h in handles]
    output = node.output_of(read_parquet(state.sparkSession, storage.fs, paths, struct, sizes=file_sizes))
    shown = node.output_arrow(rows)
    held = None if shown is None else DriverRows(shown.append_column(KEY_HASH, batch[KEY_HASH]), node.keys)
    metrics = {**full_version_metrics(snapshot), "state_merged_on_driver": 1}
    return OperatorCheckpoint(snapshot, output, metrics, held, len(rows))


def _ranged_first_state(
    node: StatefulOperator, inputs: Mapping[str, DataFrame], estimate: int
) -> tuple[DataFrame | None, int]:
    """``node``'s first state (:meth:`StatefulOperator.first_state`, ``None`` without that form), each row with
    its range (:data:`RANGE`) of as many ranges as ``estimate`` rows want, or a multiple of that which keeps
    every task slot busy (:func:`balanced_parallelism`); and that number of ranges."""
    max_parallelism = node.max_parallelism
    slots = task_slots(inputs[node.inputs[0].uid].sparkSession)
    ranges = balanced_parallelism(ranges_for(estimate, max_parallelism), slots, max_parallelism)
    return node.first_state(inputs, range_index(node.keys, max_parallelism, ranges), RANGE, ranges), ranges


def _grouped(handles: list[StateHandle], max_parallelism: int, ranges: int, rows: int) -> list[StateHandle]:
    """The files of a first version written in ``ranges`` ranges, each labelled with the range that holds it
    of the fewest ranges ``rows`` rows want (:func:`coarsest_nesting`): as a later compaction finds them."""
    fewer = coarsest_nesting(
        max_parallelism, [h.key_groups for h in handles if h.key_groups], ranges_for(rows, max_parallelism)
    )
    if fewer >= ranges:
        return handles
    return [replace(h, key_groups=_span_in(h, max_parallelism, fewer)) for h in handles]


def _span_in(handle: StateHandle, max_parallelism: int, parallelism: int) -> tuple[int, int]:
    """The key-group range, of ``parallelism``, that holds ``handle``'s."""
    return range_for_index(max_parallelism, parallelism, range_of(handle, max_parallelism, parallelism))
