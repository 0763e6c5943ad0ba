"""Windows merged on the driver: a checkpoint's per-window partials combined with the open windows'
state in pyarrow, and the windows the watermark closes deleted and emitted
(:func:`~airflow_provider_checkpoint.state.driver_merge.merge_on_driver` reads and writes the state files)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.dataflow.operator import DELETED, NEW
from airflow_provider_checkpoint.dataflow.sessions import WINDOW_END

if TYPE_CHECKING:
    import pyarrow as pa


def closed_mask(table: pa.Table, lateness_ms: int, watermark_ms: int | None) -> pa.Array:
    """Per window of ``table``: its end plus ``lateness_ms`` is at most the watermark (it is final)."""
    import numpy as np
    import pyarrow as pa

    if watermark_ms is None:
        return pa.array(np.zeros(len(table), np.bool_))
    ends = table[WINDOW_END].cast(pa.int64()).to_numpy(zero_copy_only=False)
    return pa.array(ends + lateness_ms * 1000 <= watermark_ms * 1000)


def untouched(state: pa.Table, partials: pa.Table, keys: Sequence[str]) -> pa.Table:
    """The rows of ``state`` whose key is not in ``partials`` (a null key is a key like any other)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    tagged = [
        state.select(list(keys)).append_column("__row", pa.array(np.arange(len(state), dtype=np.int64))),
        partials.select(list(keys))
        .cast(state.select(list(keys)).schema)
        .append_column("__row", pa.array(np.full(len(partials), -1, np.int64))),
    ]
    grouped = pa.concat_tables(tagged).group_by(list(keys), use_threads=False).aggregate([("__row", "min")])
    rows = pc.filter(grouped["__row_min"], pc.greater_equal(grouped["__row_min"], 0))  # -1: named by the input
    return state.take(np.sort(rows.to_numpy()))


def merge_windows(
    merge: Callable[[pa.Table, pa.Table], pa.Table],
    state: pa.Table,
    partials: pa.Table,
    keys: Sequence[str],
    lateness_ms: int,
    watermark_ms: int | None,
    emit: str,
) -> tuple[pa.Table, pa.Table]:
    """The changed windows and the output of one checkpoint: ``merge`` (the aggregates' arrow merge)
    combines the windows of ``partials`` with their ``state`` rows; a merged window the watermark
    closes is deleted (if it had state) and, ``emit="final"``, emitted; a window left open is written;
    a window of ``state`` without new rows that the watermark closes is deleted and, ``emit="final"``,
    emitted; ``emit="update"`` emits every merged window."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    merged = merge(state, partials)
    closes = closed_mask(merged, lateness_ms, watermark_ms)
    olds = untouched(state, partials, keys)
    ended = olds.filter(closed_mask(olds, lateness_ms, watermark_ms))

    def flagged(table: pa.Table, deleted: bool, new: bool | None = None) -> pa.Table:
        n = len(table)
        table = table.append_column(DELETED, pa.array(np.full(n, deleted, np.bool_)))
        return table if new is None else table.append_column(NEW, pa.array(np.full(n, new, np.bool_)))

    columns = merged.column_names
    changes = pa.concat_tables(
        [
            flagged(merged.filter(pc.invert(closes)), False),
            flagged(merged.filter(pc.and_(closes, pc.invert(merged[NEW]))), True),
            flagged(ended.select([c for c in columns if c != NEW and c in ended.column_names]), True, False),
        ],
        promote_options="permissive",
    )
    emitted = (
        merged if emit == "update" else pa.concat_tables([merged.filter(closes), ended], promote_options="permissive")
    )
    return changes, emitted
