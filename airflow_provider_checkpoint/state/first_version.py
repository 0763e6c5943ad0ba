"""An operator's first state written by key-group range in the pass that computes it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.core.faults import fault_point
from airflow_provider_checkpoint.core.settings import CheckpointSettings
from airflow_provider_checkpoint.dataflow.observation import observed_metrics
from airflow_provider_checkpoint.dataflow.operator import StatefulOperator
from airflow_provider_checkpoint.fileio.scans import as_nullable, read_parquet
from airflow_provider_checkpoint.state.handles import OperatorSnapshot, StateHandle
from airflow_provider_checkpoint.state.incremental import ranges_for
from airflow_provider_checkpoint.state.keygroups import balanced_parallelism, coarsest_nesting, range_for_index
from airflow_provider_checkpoint.state.operator_checkpoint import OperatorCheckpoint, full_version_metrics, range_of
from airflow_provider_checkpoint.state.spark_backend import RANGE, first_state_rows, range_index, write_ranged
from airflow_provider_checkpoint.storage import Location

if TYPE_CHECKING:
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
    slots = inputs[node.inputs[0].uid].sparkSession.sparkContext.defaultParallelism
    ranges = balanced_parallelism(ranges_for(estimate, max_parallelism), slots, max_parallelism)
    state = node.first_state(inputs, range_index(node.keys, max_parallelism, ranges), RANGE, ranges)
    if state is None:
        return None
    observation = Observation()
    observed = state.observe(observation, F.count(F.lit(1)).alias("rows"))
    fault_point("step.before_state_write", **where)
    handles = write_ranged(storage, directory, observed, max_parallelism, ranges)
    rows = int(observed_metrics(observation, lambda: None if handles else Row(rows=0))["rows"])
    fewer = coarsest_nesting(
        max_parallelism, [h.key_groups for h in handles if h.key_groups], ranges_for(rows, max_parallelism)
    )
    if fewer < ranges:
        handles = [replace(h, key_groups=_span_in(h, max_parallelism, fewer)) for h in handles]
    fault_point("step.after_state_write", **where)
    schema = as_nullable(state.drop(RANGE).schema)
    snapshot = OperatorSnapshot(tuple(handles), schema.json(), node.keys, max_parallelism, rows)
    paths, sizes = [storage.path(h.path) for h in handles], [h.size for h in handles]
    output = node.output_of(read_parquet(state.sparkSession, storage.fs, paths, schema, sizes=sizes))
    return OperatorCheckpoint(snapshot, output, full_version_metrics(snapshot), output_rows=rows)


def _span_in(handle: StateHandle, max_parallelism: int, parallelism: int) -> tuple[int, int]:
    """The key-group range, of ``parallelism``, that holds ``handle``'s."""
    return range_for_index(max_parallelism, parallelism, range_of(handle, max_parallelism, parallelism))
