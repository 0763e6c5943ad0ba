"""Session windows merged on the driver: a checkpoint's per-row sessions combined with the open sessions
of the state in pyarrow and numpy, as :func:`~.sessions.merge_sessions` and
:meth:`~.windows.WindowAggregate.changes_at` combine them in Spark.

Sessions of one key (the group keys) that overlap or touch are one: sorted by start (then end), a
session opens where its start is after every end before it. A merged session that gathered new rows
is written under its new bounds (``__new`` when no state row had exactly those bounds) and the state
rows it swallowed under other bounds are deleted under theirs; every session the watermark closes is
deleted (if it had a state row) and emitted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.dataflow.operator import DELETED, NEW
from airflow_provider_checkpoint.dataflow.sessions import WINDOW_END, WINDOW_START
from airflow_provider_checkpoint.dataflow.window_merge import closed_mask

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

RANGE = "__kgr"
"""The key-group range index of a row (the driver merge's column)."""
_KEPT = "__kept"


def merge_session_windows(
    merge: Callable[[pa.Table, pa.Table], pa.Table],
    state: pa.Table,
    partials: pa.Table,
    group_keys: Sequence[str],
    lateness_ms: int,
    watermark_ms: int | None,
    ranges: Callable[[pa.Table], pa.Array],
) -> tuple[pa.Table, pa.Table]:
    """The changed sessions and the output of one checkpoint.

    ``state``: every open session (the state columns and :data:`RANGE`); ``partials``: the checkpoint's
    on-time rows as sessions of their own (``[ts, ts + gap)``, the aggregates' state columns), one row
    per key and bounds. ``merge`` (the aggregates' arrow merge, :meth:`~.stateful.KeyedAggregate.merge_arrow`)
    combines rows with the same keys and bounds; ``ranges`` gives the range of a new session's row.
    The changes hold the state columns, ``__deleted``, ``__new`` and :data:`RANGE` (a deleted row had
    state, under its own range); the output the sessions the watermark closes."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = [c for c in state.column_names if c != RANGE]
    partials = partials.select(columns).cast(state.select(columns).schema)
    rows, in_state, merged_start, merged_end, gathered = _merged_bounds(state, partials, list(group_keys))
    kept = _micros(state.take(rows[in_state])[WINDOW_START]) == merged_start[in_state]
    kept &= _micros(state.take(rows[in_state])[WINDOW_END]) == merged_end[in_state]
    swallowed = gathered[in_state]  # state rows of sessions with new rows
    inputs = pa.concat_tables(  # every row of the sessions with new rows, under the merged bounds
        [
            _relabelled(
                state.select(columns).take(rows[in_state][swallowed]),
                merged_start[in_state][swallowed],
                merged_end[in_state][swallowed],
                kept[swallowed],
            ),
            _relabelled(
                partials.take(rows[~in_state]),
                merged_start[~in_state],
                merged_end[~in_state],
                np.zeros(int((~in_state).sum()), np.bool_),
            ),
        ]
    )
    sessions = merge(inputs.select(columns).slice(0, 0), inputs)  # ``__kept`` (an extra column): its max
    sessions = sessions.select(columns).append_column(NEW, pc.equal(sessions[_KEPT], 0))
    sessions = sessions.append_column(RANGE, ranges(sessions))
    closes = closed_mask(sessions, lateness_ms, watermark_ms)
    moved = state.take(rows[in_state][swallowed & ~kept])
    resting = state.take(np.sort(rows[in_state][~swallowed]))
    ended = resting.filter(closed_mask(resting, lateness_ms, watermark_ms))

    def flagged(table: pa.Table, deleted: bool, new: pa.Array | None = None) -> pa.Table:
        n = len(table)
        return (
            table.select([*columns, RANGE])
            .append_column(DELETED, pa.array(np.full(n, deleted, np.bool_)))
            .append_column(NEW, pa.array(np.zeros(n, np.bool_)) if new is None else new)
        )

    written = sessions.filter(pc.invert(closes))
    changes = pa.concat_tables(
        [
            flagged(written, False, written[NEW]),
            flagged(sessions.filter(pc.and_(closes, pc.invert(sessions[NEW]))), True),  # had a state row
            flagged(moved, True),
            flagged(ended, True),
        ]
    )
    emitted = pa.concat_tables([sessions.filter(closes).select(columns), ended.select(columns)])
    return changes, emitted


def _merged_bounds(
    state: pa.Table, partials: pa.Table, keys: list[str]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The rows of ``state`` then ``partials`` sorted by keys and bounds: each one's row number (in its own
    table), whether it is a state row, the bounds of the session it merges into, and whether that
    session has rows of ``partials``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    bounds = [WINDOW_START, WINDOW_END]
    spans = pa.concat_tables([state.select([*keys, *bounds]), partials.select([*keys, *bounds])])
    sort = [*((k, "ascending", "at_start") for k in keys), *((b, "ascending") for b in bounds)]
    order = pc.sort_indices(spans, sort).to_numpy()
    spans = spans.take(order)
    start, end = _micros(spans[WINDOW_START]), _micros(spans[WINDOW_END])
    session, first = _sessions(_group_starts(spans, keys), start, end)
    in_state = order < len(state)
    if not len(first):
        return order, in_state, start, end, np.zeros(0, np.bool_)
    gathered = np.maximum.reduceat((~in_state).astype(np.int8), first) == 1
    rows = np.where(in_state, order, order - len(state))
    return rows, in_state, start[first][session], np.maximum.reduceat(end, first)[session], gathered[session]


def _micros(column: pa.ChunkedArray) -> np.ndarray:
    import numpy as np
    import pyarrow as pa

    return np.asarray(column.cast(pa.int64()).to_numpy(zero_copy_only=False), np.int64)


def _group_starts(table: pa.Table, keys: Sequence[str]) -> np.ndarray:
    """Per row of ``table`` (sorted by ``keys``): whether it is the first of its keys (nulls equal)."""
    import numpy as np
    import pyarrow.compute as pc

    starts = np.zeros(len(table), np.bool_)
    if len(table):
        starts[0] = True
    for k in keys:
        a, b = table[k].slice(1), table[k].slice(0, max(len(table) - 1, 0))
        differs = pc.or_(pc.fill_null(pc.not_equal(a, b), False), pc.xor(pc.is_null(a), pc.is_null(b)))
        starts[1:] |= np.asarray(differs.to_numpy(zero_copy_only=False), np.bool_)
    return starts


def _sessions(group_starts: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row (sorted by keys, then start), the index of its session, and each session's first row: a row
    opens one when it is the first of its keys or starts after every end of its keys' rows before it."""
    import numpy as np

    ends, rank = np.unique(end, return_inverse=True)
    group = np.cumsum(group_starts) - 1
    ranked = group.astype(np.int64) * len(ends) + rank  # a running maximum never crosses into the next keys
    reach = np.maximum.accumulate(ranked) if len(ranked) else ranked
    opens = group_starts.copy()
    if len(start) > 1:
        before = np.maximum(reach[:-1] - group[1:] * len(ends), 0)  # of the same keys unless it opens anyway
        opens[1:] |= start[1:] > ends[before]  # after the greatest end before
    first = np.flatnonzero(opens)
    return np.cumsum(opens) - 1, first


def _relabelled(table: pa.Table, start: np.ndarray, end: np.ndarray, kept: np.ndarray) -> pa.Table:
    """``table`` with the bounds of the sessions its rows merge into, and whether they were its own."""
    import numpy as np
    import pyarrow as pa

    for name, values in ((WINDOW_START, start), (WINDOW_END, end)):
        i = table.schema.get_field_index(name)
        table = table.set_column(
            i, table.schema.field(i), pa.array(values, pa.int64()).cast(table.schema.field(i).type)
        )
    return table.append_column(_KEPT, pa.array(kept.astype(np.int8)))
