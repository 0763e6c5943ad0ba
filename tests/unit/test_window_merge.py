"""Windows merged on the driver (pyarrow) against plain Python: open windows combined with a checkpoint's
per-window partials, and those the watermark closes deleted and emitted, with or without new rows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_checkpoint.core.event_time import WatermarkProgress
from airflow_provider_checkpoint.dataflow import FileSource, WindowAggregate, tumbling
from airflow_provider_checkpoint.dataflow.operator import DELETED, NEW

MINUTE = 60_000
T0 = datetime(2026, 1, 1, tzinfo=UTC)
T0_MS = int(T0.timestamp() * 1000)
TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema(
    [("user", pa.string()), ("window_start", TS), ("window_end", TS), ("n", pa.int64()), ("total", pa.int64())]
)
Key = tuple[str | None, int]  # user, window index (5-minute windows)


def node(emit: str, lateness: str) -> WindowAggregate:
    events = FileSource("events", "/tmp/in", "json", "user STRING, ts TIMESTAMP, amount LONG")
    aggs = {"n": "count", "total": "sum(amount)"}
    window = tumbling("5 minutes")
    return WindowAggregate("w", events, ["user"], "ts", window, aggs, ("ts", "1 minute"), lateness, emit)


def table(rows: dict[Key, tuple[int, int]], kgr: bool) -> pa.Table:
    listed = [
        {
            "user": user,
            "window_start": T0 + timedelta(minutes=5 * w),
            "window_end": T0 + timedelta(minutes=5 * w + 5),
            "n": n,
            "total": total,
        }
        for (user, w), (n, total) in rows.items()
    ]
    t = pa.Table.from_pylist(listed, SCHEMA)
    return t.append_column("__kgr", pa.array([7] * len(t), pa.int32())) if kgr else t


def by_key(t: pa.Table) -> dict[Key, dict[str, Any]]:
    return {(r["user"], int((r["window_start"] - T0) / timedelta(minutes=5))): r for r in t.to_pylist()}


windows = st.dictionaries(
    st.tuples(st.sampled_from(["a", "b", None]), st.integers(0, 5)),
    st.tuples(st.integers(1, 5), st.integers(0, 50)),
    max_size=12,
)


@settings(max_examples=15, deadline=None)
@given(
    old=windows,
    new=windows,
    mark=st.none() | st.integers(0, 40),
    lateness=st.sampled_from([0, 5]),
    emit=st.sampled_from(["final", "update"]),
)
def test_windows_merged_on_the_driver_match_plain_python(
    old: dict[Key, tuple[int, int]],
    new: dict[Key, tuple[int, int]],
    mark: int | None,
    lateness: int,
    emit: str,
) -> None:
    agg = node(emit, f"{lateness} minutes")
    watermark = None if mark is None else T0_MS + mark * MINUTE
    progress = WatermarkProgress(watermark=watermark)
    changes, emitted = agg.merge_at_arrow(table(old, True), table(new, True), progress, lambda t: pa.nulls(len(t)))

    def closes(key: Key) -> bool:
        return watermark is not None and T0_MS + (5 * key[1] + 5 + lateness) * MINUTE <= watermark

    merged = {k: tuple(a + b for a, b in zip(old.get(k, (0, 0)), v, strict=True)) for k, v in new.items()}
    expected_changes = {k: (v, False) for k, v in merged.items() if not closes(k)}
    expected_changes |= {k: (merged.get(k, v), True) for k, v in old.items() if closes(k)}
    got = by_key(changes)
    assert {k: ((r["n"], r["total"]), r[DELETED]) for k, r in got.items()} == expected_changes
    assert len(changes) == len(got)  # one change per window
    assert all(r[NEW] is (k not in old) for k, r in got.items())
    assert all(r["__kgr"] == 7 for r in got.values())
    final = {k: v for k, v in {**old, **merged}.items() if closes(k)}
    shown = final if emit == "final" else merged
    assert {k: (r["n"], r["total"]) for k, r in by_key(emitted).items()} == shown
    assert len(emitted) == len(shown)
    closing, below = agg.closes_below(WatermarkProgress(watermark=watermark))
    assert closing == "window_end"
    if below is not None:  # the bound the state files' statistics are compared with
        ends = {k: (T0_MS + (5 * k[1] + 5) * MINUTE) * 1000 for k in old}
        assert {k for k, end in ends.items() if end < below} == {k for k in old if closes(k)}


def test_a_range_is_read_for_closing_only_if_its_files_may_hold_a_window_the_watermark_closes(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """By the least window end each handle records, opening no file; a handle written before handles
    recorded it falls back to its file's footer, one open, with the same answers."""
    import dataclasses

    import numpy as np

    from airflow_provider_checkpoint.state.driver_merge import Closing
    from airflow_provider_checkpoint.state.files import DELETED as DEL
    from airflow_provider_checkpoint.state.files import SEQ, write_state_file
    from airflow_provider_checkpoint.state.handles import NOTHING_CLOSES
    from airflow_provider_checkpoint.storage import JobStorage

    storage = JobStorage.for_job(str(tmp_path), "job")
    rows = table({("a", 2): (1, 1), ("b", 4): (2, 2)}, False)  # ends: 15 and 25 minutes
    handle = write_state_file(storage, "state/f.parquet", rows, (0, 3), closing="window_end")
    end_us = (T0_MS + 15 * MINUTE) * 1000
    assert handle.least_end == end_us
    legacy = dataclasses.replace(handle, least_end=None)
    # a delta deleting the window ending at 5 minutes and updating the one at 25: live rows end at 25
    change = table({("a", 0): (1, 1), ("b", 4): (3, 3)}, False)
    change = change.append_column(DEL, pa.array([True, False])).append_column(SEQ, pa.array(np.full(2, 2, np.int64)))
    delta = write_state_file(storage, "state/d.parquet", change, (0, 3), 2, "window_end")
    assert delta.least_end == (T0_MS + 25 * MINUTE) * 1000
    gone = write_state_file(storage, "state/g.parquet", change.slice(0, 1), (0, 3), 2, "window_end")
    assert gone.least_end == NOTHING_CLOSES  # tombstones only: nothing in it closes
    opened: list[str] = []
    real_open = storage.fs.open
    monkeypatch.setattr(storage.fs, "open", lambda path, *a, **k: opened.append(path) or real_open(path, *a, **k))

    def closing(below: int | None) -> Closing:
        return Closing(lambda s, p, r: (s, p), "window_end", below)

    for recorded, opens in ((handle, 0), (legacy, 1)):
        opened.clear()
        assert closing(end_us + 1).may_close(storage, [recorded])
        assert len(opened) == opens
        assert not closing(end_us).may_close(storage, [recorded])  # the earliest window ends at the bound: open
        assert not closing(None).may_close(storage, [recorded])
    opened.clear()
    assert not closing(end_us + 1).may_close(storage, [delta, gone])  # the deleted window's end is not live
    assert closing(2**62).may_close(storage, [delta, gone])
    assert opened == []


def test_state_files_by_spark_and_by_pyarrow_merge_with_their_times_as_instants(tmp_path: Any) -> None:
    """A full version Spark wrote (INT96 times: naive nanoseconds in pyarrow) under deltas the driver wrote
    (UTC microseconds), as a savepoint and a driver merge read them."""
    import json

    import numpy as np

    from airflow_provider_checkpoint.state.files import DELETED as DEL
    from airflow_provider_checkpoint.state.files import SEQ, merged_rows, write_state_file
    from airflow_provider_checkpoint.state.handles import OperatorSnapshot
    from airflow_provider_checkpoint.storage import JobStorage

    storage = JobStorage.for_job(str(tmp_path), "job")
    rows = table({("a", 0): (1, 1), ("b", 0): (2, 2), ("c", 1): (3, 3)}, False)
    naive = pa.schema([f.with_type(pa.timestamp("ns")) if pa.types.is_timestamp(f.type) else f for f in SCHEMA])
    base = write_state_file(storage, "state/base.parquet", rows.cast(naive), (0, 3))
    change = table({("a", 0): (5, 5), ("c", 1): (3, 3)}, False)
    change = change.append_column(DEL, pa.array([False, True])).append_column(SEQ, pa.array(np.full(2, 2, np.int64)))
    delta = write_state_file(storage, "state/delta.parquet", change, (0, 3), 2)
    fields = [
        {
            "name": f.name,
            "type": "timestamp" if pa.types.is_timestamp(f.type) else {"string": "string"}.get(str(f.type), "long"),
            "nullable": True,
            "metadata": {},
        }
        for f in SCHEMA
    ]
    snapshot = OperatorSnapshot(
        (base, delta), json.dumps({"type": "struct", "fields": fields}), ("user", "window_start", "window_end"), 4, 3
    )
    merged = merged_rows(storage, snapshot, snapshot.handles, "w")
    assert merged.schema.field("window_start").type == TS
    assert {k: (r["n"], r["total"]) for k, r in by_key(merged).items()} == {("a", 0): (5, 5), ("b", 0): (2, 2)}
