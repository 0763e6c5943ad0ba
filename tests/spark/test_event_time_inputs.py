"""A window over two sources: the minimum of their watermarks, Spark's own as the oracle, and idleness.

Two file sources declare ``watermark=("ts", "10 minutes")``; a union of them feeds two tumbling
windows, one without idleness and one with ``idle_after="250 s"`` (checkpoints here are 100 s of
barrier time apart, so a source is idle at its third checkpoint without rows). The ``slow`` source
lags the ``fast`` one by more than the bound, so its rows would be late under a watermark of the
greatest time (Spark's ``multipleWatermarkPolicy=max``). The watermarks are worked out by hand below,
and the tables follow from them by a plain model; while both sources have rows, Spark Structured
Streaming (``withWatermark`` on both sides of a union, the default ``min`` policy, ``Trigger.AvailableNow``
per increment) must give the same table. Then ``slow`` falls silent, ``fast`` goes on, ``slow`` returns
behind; a restore from a savepoint, at another parallelism and with ranges split, replays the last
checkpoint to the same watermarks and rows.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_checkpoint.dataflow import FileSource, ParquetTableSink, Union, WindowAggregate, tumbling
from airflow_provider_checkpoint.restore.requests import request_restore
from airflow_provider_checkpoint.testing.inprocess import make_job
from tests.spark.helpers import table, write_json

pytestmark = pytest.mark.spark

SCHEMA = "user STRING, ts TIMESTAMP, amount LONG"
T0 = datetime.datetime(2026, 3, 1, tzinfo=datetime.UTC)
MIN = 60_000
BASE = int(T0.timestamp() * 1000)
WINDOW = 5 * MIN

# per checkpoint: (source, user, minute) rows; amount = minute
ROWS: list[list[tuple[str, str, int]]] = [
    [("fast", "a", 20), ("fast", "a", 22), ("fast", "b", 21), ("slow", "a", 5), ("slow", "a", 8)],
    [("fast", "a", 40), ("fast", "b", 38), ("slow", "a", 12), ("slow", "b", 3)],  # b@3: late under the max
    [("fast", "a", 60), ("slow", "a", 30)],
    [("fast", "a", 70)],  # slow silent from here on
    [("fast", "a", 80)],
    [("fast", "a", 90)],  # slow quiet for 300 s >= 250 s: idle
    [("fast", "a", 95), ("slow", "a", 50), ("slow", "b", 85)],  # slow is back, behind; a@50 late when idle
]
# the watermark (minutes) after each checkpoint: min(fast, slow) of (greatest time - 10)
PLAIN = [-2, 2, 20, 20, 20, 20, 75]
IDLE = [-2, 2, 20, 20, 20, 80, 80]  # slow left out at checkpoint 6; back behind at 7: it holds
LATE = {"plain": [0] * 7, "idle": [0] * 6 + [1]}
SPARK_INCREMENTS = 3


def declare(tmp: Path) -> None:
    sources = [FileSource(s, str(tmp / s), "json", SCHEMA, watermark=("ts", "10 minutes")) for s in ("fast", "slow")]
    both = Union("both", sources)
    aggs = {"clicks": "count", "total": "sum(amount)"}
    for name, idle in (("plain", None), ("idle", "250 s")):
        agg = WindowAggregate(name, both, ["user"], "ts", tumbling("5 minutes"), aggs, idle_after=idle)
        ParquetTableSink(f"{name}_out", agg, str(tmp / name), mode="append", step="windows")


def land(tmp: Path, n: int, roots: tuple[str, ...]) -> None:
    for source in ("fast", "slow"):
        rows = [
            {"user": u, "ts": (T0 + datetime.timedelta(minutes=m)).isoformat(), "amount": m}
            for s, u, m in ROWS[n - 1]
            if s == source
        ]
        for root in roots if rows else ():
            write_json(tmp / root / source / f"e{n}.json", rows)


def model(checkpoints: int, marks: list[int]) -> list[tuple[str, int, int, int, int]]:
    """The windows emitted by ``checkpoints`` checkpoints with the watermarks ``marks``: a row is late when
    its window ended by the watermark before its checkpoint; a window is emitted once the watermark
    reaches its end. Rows ``(user, start ms, end ms, clicks, total)``."""
    windows: dict[tuple[str, int], list[int]] = {}
    emitted = []
    for n in range(checkpoints):
        before = marks[n - 1] * MIN if n else None
        for _, user, minute in ROWS[n]:
            start = minute * MIN - minute * MIN % WINDOW
            if before is None or start + WINDOW > before:
                windows.setdefault((user, start), []).append(minute)
        for (user, start), minutes in sorted(windows.items()):
            if start + WINDOW <= marks[n] * MIN:
                emitted.append((user, BASE + start, BASE + start + WINDOW, len(minutes), sum(minutes)))
                del windows[(user, start)]
    return sorted(emitted)


def ours(path: Path) -> list[tuple[str, int, int, int, int]]:
    got = table(path)
    if got.empty:
        return []
    ms = {
        c: got[c].dt.tz_localize(None).astype("datetime64[ms]").astype("int64") for c in ("window_start", "window_end")
    }
    rows = zip(got["user"], ms["window_start"], ms["window_end"], got["clicks"], got["total"], strict=True)
    return sorted((u, int(s), int(e), int(c), int(t)) for u, s, e, c, t in rows)


def spark_min_of_two(spark: Any, tmp: Path) -> list[tuple[str, int, int, int, int]]:
    """Spark's union of two streams, each with its own ``withWatermark``, one ``AvailableNow`` run."""
    from pyspark.sql import functions as F

    assert spark.conf.get("spark.sql.streaming.multipleWatermarkPolicy", "min") == "min"
    fast, slow = (
        spark.readStream.schema(SCHEMA).json(str(tmp / "spark" / s)).withWatermark("ts", "10 minutes")
        for s in ("fast", "slow")
    )
    windows = (
        fast.unionByName(slow)
        .groupBy(F.window("ts", "5 minutes").alias("w"), "user")
        .agg(F.count(F.lit(1)).alias("clicks"), F.sum("amount").alias("total"))
    )
    query = (
        windows.writeStream.outputMode("append")
        .format("parquet")
        .option("path", str(tmp / "spark_out"))
        .option("checkpointLocation", str(tmp / "spark_ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    out = spark.read.parquet(str(tmp / "spark_out")) if (tmp / "spark_out").exists() else None
    if out is None:
        return []
    rows = out.select(
        "user",
        (F.unix_micros("w.start") / 1000).cast("long"),
        (F.unix_micros("w.end") / 1000).cast("long"),
        "clicks",
        "total",
    ).collect()
    return sorted(tuple(r) for r in rows)  # type: ignore[misc]


def test_a_window_over_two_sources_takes_their_minimum_and_leaves_an_idle_one_out(spark, tmp_path, small_ranges):
    job = make_job(spark, tmp_path, declare, inline_state_threshold=0)
    marks = {"plain": PLAIN, "idle": IDLE}
    savepoint = f"file://{tmp_path}/savepoints/sp-6"
    for n in range(1, len(ROWS) + 1):
        land(tmp_path, n, ("", "spark") if n <= SPARK_INCREMENTS else ("",))
        completed = job.checkpoint(savepoint_target=savepoint if n == 6 else None)
        dropped = sum(step.get("late_rows_dropped", 0) for step in completed.stats["steps"].values())
        for uid, expected in marks.items():
            progress = completed.operators[uid].event_time
            assert progress is not None and progress.watermark == BASE + expected[n - 1] * MIN, (uid, n, progress)
            assert ours(tmp_path / uid) == model(n, expected), f"{uid} after checkpoint {n}"
        assert dropped == LATE["plain"][n - 1] + LATE["idle"][n - 1]  # the step's metric sums its operators
        if n <= SPARK_INCREMENTS:
            assert ours(tmp_path / "plain") == spark_min_of_two(spark, tmp_path), f"Spark differs after {n}"
    assert ours(tmp_path / "idle") != ours(tmp_path / "plain"), "idleness must have closed windows earlier"
    fast = dict(completed.operators["idle"].event_time.inputs)["fast"]  # type: ignore[union-attr]
    assert fast.watermark == BASE + 85 * MIN and fast.active_at == int((1_800_000_000.0 + 700) * 1000)

    # back to the savepoint of checkpoint 6, at another parallelism: checkpoint 7 again, the same
    before = {uid: completed.operators[uid].event_time for uid in marks}
    request_restore(job.storage, savepoint, False, False)
    previous = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "3")
    try:
        again = job.checkpoint()
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", previous)
    for uid, expected in marks.items():
        progress = again.operators[uid].event_time
        assert progress is not None and (progress.watermark, progress.max_event_time) == (
            before[uid].watermark,  # type: ignore[union-attr]
            before[uid].max_event_time,  # type: ignore[union-attr]
        )
        assert ours(tmp_path / uid) == model(len(ROWS), expected), f"{uid} after the replay"
