"""Session windows merged on the driver (pyarrow, numpy) against plain Python: open sessions and a
checkpoint's rows merged per user, moved sessions deleted under their old bounds, and the sessions the
watermark closes deleted and emitted, with or without new rows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_checkpoint.core.event_time import WatermarkProgress
from airflow_provider_checkpoint.dataflow import FileSource, WindowAggregate, session
from airflow_provider_checkpoint.dataflow.operator import DELETED, NEW

MINUTE = 60_000
GAP = 5
T0 = datetime(2026, 1, 1, tzinfo=UTC)
T0_MS = int(T0.timestamp() * 1000)
TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema(
    [("user", pa.string()), ("window_start", TS), ("window_end", TS), ("n", pa.int64()), ("total", pa.int64())]
)
Key = tuple[str | None, int, int]  # user, start and end in minutes after T0
Aggs = tuple[int, int]


def node(lateness: str) -> WindowAggregate:
    events = FileSource("events", "/tmp/in", "json", "user STRING, ts TIMESTAMP, amount LONG")
    aggs = {"n": "count", "total": "sum(amount)"}
    return WindowAggregate("s", events, ["user"], "ts", session(f"{GAP} minutes"), aggs, ("ts", "1 minute"), lateness)


def merged(sessions: dict[Key, Aggs], new: Key, aggs: Aggs) -> tuple[dict[Key, Aggs], Key]:
    """``sessions`` with ``new`` added (every session of its user it overlaps or touches merges with it)."""
    user, start, end = new
    kept = dict(sessions)
    for key in sorted(kept, key=lambda k: k[1]):  # by start: a merge only reaches later sessions
        if key[0] == user and key[1] <= end and start <= key[2]:
            n, total = kept.pop(key)
            aggs, start, end = (aggs[0] + n, aggs[1] + total), min(start, key[1]), max(end, key[2])
    kept[(user, start, end)] = aggs
    return kept, (user, start, end)


def table(rows: dict[Key, Aggs], kgr: list[int] | None) -> pa.Table:
    listed = [
        {
            "user": u,
            "window_start": T0 + timedelta(minutes=s),
            "window_end": T0 + timedelta(minutes=e),
            "n": n,
            "total": total,
        }
        for (u, s, e), (n, total) in rows.items()
    ]
    t = pa.Table.from_pylist(listed, SCHEMA)
    return t if kgr is None else t.append_column("__kgr", pa.array(kgr, pa.int32()))


def key_of(row: dict[str, Any]) -> Key:
    return (
        row["user"],
        (row["window_start"] - T0) // timedelta(minutes=1),
        (row["window_end"] - T0) // timedelta(minutes=1),
    )


def fake_range(key: Key) -> int:
    return len(key[0] or "") + key[1] % 3 + key[2] % 5


rows_strategy = st.lists(
    st.tuples(st.sampled_from(["a", "bb", None]), st.integers(0, 40), st.integers(1, 9)), max_size=12
)


@settings(max_examples=40, deadline=None)
@given(old=rows_strategy, new=rows_strategy, mark=st.none() | st.integers(0, 60), lateness=st.sampled_from([0, 3]))
def test_sessions_merged_on_the_driver_match_plain_python(
    old: list[tuple[str | None, int, int]], new: list[tuple[str | None, int, int]], mark: int | None, lateness: int
) -> None:
    state: dict[Key, Aggs] = {}
    for user, ts, amount in old:
        state, _ = merged(state, (user, ts, ts + GAP), (1, amount))
    partials: dict[Key, Aggs] = {}  # one row per user and time, as Spark's partial aggregation gives
    for user, ts, amount in new:
        n, total = partials.get((user, ts, ts + GAP), (0, 0))
        partials[(user, ts, ts + GAP)] = (n + 1, total + amount)
    after, gathered = dict(state), set()
    for key, aggs in partials.items():
        after, grown = merged(after, key, aggs)
        gathered = {k for k in gathered if k in after} | {grown}

    watermark = None if mark is None else T0_MS + mark * MINUTE
    changes, emitted = node(f"{lateness} minutes").merge_at_arrow(
        table(state, [fake_range(k) for k in state]),  # filed as the state files it
        table(partials, [99] * len(partials)),  # the input rows' own ranges: never a new session's
        WatermarkProgress(watermark=watermark),
        lambda t: pa.array([fake_range(key_of(r)) for r in t.to_pylist()], pa.int32()),
    )

    def closes(key: Key) -> bool:
        return watermark is not None and T0_MS + (key[2] + lateness) * MINUTE <= watermark

    expected = {k: (v, False, k not in state) for k, v in after.items() if k in gathered and not closes(k)}
    expected |= {k: (None, True, False) for k in state if k not in after or closes(k)}  # a tombstone: any values
    got = {key_of(r): (None if r[DELETED] else (r["n"], r["total"]), r[DELETED], r[NEW]) for r in changes.to_pylist()}
    assert got == expected
    assert len(changes) == len(got)  # one change per session
    assert all(r["__kgr"] == fake_range(key_of(r)) for r in changes.to_pylist())
    final = {k: v for k, v in after.items() if closes(k)}
    assert {key_of(r): (r["n"], r["total"]) for r in emitted.to_pylist()} == final
    assert len(emitted) == len(final)
    assert emitted.column_names == SCHEMA.names


def test_a_row_bridging_two_sessions_moves_both_and_touching_bounds_merge() -> None:
    """a ``[0,5)`` and ``[7,12)``; a row at 4 ``[4,9)`` bridges them into ``[0,12)``; b ``[20,25)`` and a row at 25
    (its end: touching) give ``[20,30)``; c ``[40,45)`` has no rows and stays."""
    state = {("a", 0, 5): (1, 1), ("a", 7, 12): (1, 2), ("b", 20, 25): (2, 3), ("c", 40, 45): (1, 1)}
    partials = {("a", 4, 9): (1, 10), ("b", 25, 30): (1, 20)}
    changes, emitted = node("0 minutes").merge_at_arrow(
        table(state, [0, 1, 2, 3]),
        table(partials, [9, 9]),
        WatermarkProgress(),
        lambda t: pa.array([5] * len(t), pa.int32()),
    )
    got = {key_of(r): ((r["n"], r["total"]), r[DELETED], r[NEW], r["__kgr"]) for r in changes.to_pylist()}
    assert got == {
        ("a", 0, 12): ((3, 13), False, True, 5),
        ("b", 20, 30): ((3, 23), False, True, 5),
        ("a", 0, 5): ((1, 1), True, False, 0),
        ("a", 7, 12): ((1, 2), True, False, 1),
        ("b", 20, 25): ((2, 3), True, False, 2),
    }
    assert len(emitted) == 0
