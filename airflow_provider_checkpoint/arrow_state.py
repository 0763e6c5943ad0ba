"""Keyed state read with pyarrow alone (no Spark): full versions merged with their deltas.

Used where the provider runs without Spark — savepoints written by finalize,
:func:`~airflow_provider_checkpoint.snapshots.read_state` — with the same merge as
:func:`airflow_provider_checkpoint.spark.state.merge`: per key the newest delta row wins,
a tombstone deletes the key, a null key is a key like any other.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.core.incremental import StateLayout, merge_order
from airflow_provider_checkpoint.core.model import OperatorSnapshot, StateHandle
from airflow_provider_checkpoint.storage import Location
from airflow_provider_checkpoint.storage.job_storage import inline_parquet

if TYPE_CHECKING:
    import pyarrow as pa

DELETED, SEQ = "__deleted", "__seq"


def read_table(base: Location, state: OperatorSnapshot, uid: str) -> pa.Table:
    """The whole state of operator ``uid`` (files unchecked: verify them first)."""
    import pyarrow.parquet as pq

    if state.inline is not None:
        return pq.read_table(io.BytesIO(inline_parquet(state, uid)))
    return _merged(base, state, state.handles)


def range_tables(base: Location, state: OperatorSnapshot) -> Iterator[tuple[tuple[int, int], pa.Table]]:
    """The merged state per key-group range (all key groups at once if the files have no ranges)."""
    layout = StateLayout.of(state)
    if layout is None:
        yield (0, state.max_parallelism - 1), _merged(base, state, state.handles)
        return
    for r in layout.ranges:
        yield r.key_groups, _merged(base, state, r.handles)


def _merged(base: Location, state: OperatorSnapshot, handles: Sequence[StateHandle]) -> pa.Table:
    import pyarrow as pa

    full, deltas = merge_order(tuple(handles))
    table = _concat(base, full, state)
    if not deltas:
        return table
    changes = _concat(base, [h for _, hs in deltas for h in hs], state)
    rows = len(table)
    table = table.append_column(DELETED, pa.array([False] * rows)).append_column(SEQ, pa.array([-1] * rows, pa.int64()))
    both = pa.concat_tables([table, changes.select(table.column_names)], promote_options="permissive")
    both = both.sort_by([(SEQ, "descending")])
    both = both.append_column("__row", pa.array(range(len(both)), pa.int64()))
    newest = both.group_by(list(state.keys), use_threads=False).aggregate([("__row", "min")])
    latest = both.take(newest["__row_min"]).sort_by("__row")
    import pyarrow.compute as pc

    return latest.filter(pc.invert(pc.fill_null(latest[DELETED], False))).drop_columns([DELETED, SEQ, "__row"])


def _concat(base: Location, handles: Sequence[StateHandle], state: OperatorSnapshot) -> pa.Table:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = []
    for handle in handles:
        with base.fs.open(base.path(handle.path), "rb") as f:
            tables.append(pq.read_table(f))
    if tables:
        return pa.concat_tables(tables, promote_options="default")
    names = [field["name"] for field in json.loads(state.schema)["fields"]]
    return pa.table({name: pa.array([], pa.null()) for name in names})
