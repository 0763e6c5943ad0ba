"""``KeyedProcess`` against Spark Structured Streaming's own ``transformWithStateInPandas``.

The same functions twice, once through each API (:class:`Silence` and :class:`Recent`, ours;
:func:`spark_processor`, Spark's ``StatefulProcessor``), each in two queries:

- event time (``silence``): per user a value state ``count``, a value state ``last`` (the newest
  event time), a list ``recent`` and a map ``buckets`` (amount mod 3 → rows); one event-time timer at
  ``last + 5 minutes``, moved on by every newer row, that reports the user silent (a ``silent``
  line) and clears ``count`` and ``last``. Spark: ``EventTime`` mode, ``withWatermark``;
- processing time (``recent``): the same state, ``recent`` and ``buckets`` with a processing-time
  TTL, and a processing-time timer ``PING_MS`` after a call that finds none registered (a ``ping``
  line). Spark: ``ProcessingTime`` mode. Spark's clock is the wall clock when it plans a batch, ours
  the checkpoint's trigger time: each checkpoint is triggered at the timestamp of Spark's batch of
  the same increment, read from Spark's offset log, so both judge TTL and timers by the same clock.
  Spark's no-data batches are off for this query (in processing time every batch asks for another
  one, so ``availableNow`` would never end): timers fire in data batches, as in our checkpoints.
  Before increment ``WAIT_BEFORE`` the test waits out the TTL: ``recent`` has expired and pings fire.

Every call with rows emits one ``rows`` line (the count, how many ``recent`` entries survived their
TTL, the total in ``buckets``). The same rows, cut into the same increments: Spark runs
``Trigger.AvailableNow`` once per increment (in event time its data batch, then the no-data batch
the advanced watermark asks for: what one of our checkpoints does), with the RocksDB state store, in
a session of its own. After every increment both outputs must be equal, and so must the watermarks.

Differences on purpose, stated and checked:

- Spark drops late rows (event time at or before the watermark) before ``handleInputRows``; ours
  hands them to ``process`` (``ctx.watermark`` tells them apart), where :class:`Silence` emits a
  ``late`` line and leaves them out. The ``late`` lines must be exactly the rows behind the
  watermark, worked out here from the increments, and the rest must equal Spark's output.
- Spark's watermark before the first batch is the epoch, ours is none; the data is after 1970.
- A timer at exactly the watermark fires in both (due at ``timer <= watermark``); the seed's data
  has one, which the test checks.
"""

from __future__ import annotations

import datetime
import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from airflow_provider_checkpoint import TTL, KeyedProcess, KeyedProcessFunction, ListState, MapState, ValueState
from airflow_provider_checkpoint.core.keyed_state import StateSpec
from airflow_provider_checkpoint.dataflow import FileSource, ParquetTableSink
from airflow_provider_checkpoint.testing.inprocess import make_job
from tests.spark.helpers import table, write_json

pytestmark = pytest.mark.spark

SCHEMA = "user STRING, ts TIMESTAMP, amount LONG"
OUTPUT = "what STRING, user STRING, at LONG, n LONG, recent LONG, buckets LONG"
COLUMNS = ["what", "user", "at", "n", "recent", "buckets"]
T0 = datetime.datetime(2026, 3, 1, tzinfo=datetime.UTC)
MINUTE = 60_000
BOUND, SILENCE = 10 * MINUTE, 5 * MINUTE
RECENT_TTL_MS, BUCKETS_TTL_MS, PING_MS = 4_000, 3_600_000, 4_000
INCREMENTS = 2
WAIT_BEFORE = 2
"""The increment before which the test waits out ``recent``'s TTL (of Spark's previous data batch)."""
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def ms(ts: Any) -> int:
    """A pandas timestamp (naive UTC or aware) in ms since the epoch."""
    return int(pd.Timestamp(ts).value // 1_000_000)


class Silence(KeyedProcessFunction):
    """Per user: ``count``, ``last`` (newest event time), ``recent`` (the amounts) and ``buckets`` (amount
    mod 3 → rows); an event-time timer ``SILENCE`` after ``last`` reports the user silent."""

    output_schema = OUTPUT
    states: tuple[StateSpec, ...] = (
        ValueState("count", "long"),
        ValueState("last", "long"),
        ListState("recent", "long"),
        MapState("buckets", "long", "long"),
    )
    timers = True

    def process(self, key: Any, rows: Any, ctx: Any) -> Any:
        return self.judge(key, [ms(t) for t in rows["ts"]], [int(a) for a in rows["amount"]], ctx)

    def judge(self, key: Any, times: list[int], amounts: list[int], ctx: Any) -> Any:
        """The key's rows, as event times and amounts in the order given (by event time)."""
        assert times == sorted(times), "a key's rows come sorted by event time"
        wm = ctx.watermark
        out = [("late", key[0], t, -1, -1, -1) for t in times if wm is not None and t <= wm]
        timely = [(t, a) for t, a in zip(times, amounts, strict=True) if wm is None or t > wm]
        if not timely:
            return out
        count, last, recent, buckets = (ctx.state(n) for n in ("count", "last", "recent", "buckets"))
        amounts = [a for _, a in timely]
        n = (count.get() or 0) + len(amounts)
        count.update(n)
        survived = len(recent.get())
        recent.extend(amounts)
        for a in amounts:
            buckets.put(a % 3, buckets.get(a % 3, 0) + 1)
        newest = max(t for t, _ in timely)
        if not last.exists() or newest > last.get():
            if last.exists() and self.timers:
                ctx.delete_event_time_timer(last.get() + SILENCE)
            last.update(newest)
            if self.timers:
                ctx.register_event_time_timer(newest + SILENCE)
        return [*out, ("rows", key[0], newest, n, survived, sum(v for _, v in buckets.items()))]

    def on_timer(self, key: Any, timer: Any, ctx: Any) -> Any:
        n = ctx.state("count").get()
        ctx.state("count").clear()
        ctx.state("last").clear()
        return [("silent", key[0], timer.timestamp, n, -1, -1)]


class Recent(Silence):
    """:class:`Silence` with ``recent`` and ``buckets`` expiring by processing time and, instead of the
    event-time timer, a processing-time timer ``PING_MS`` after a call that finds none registered,
    which reports the count (a ``ping`` line). It takes its rows as a pyarrow Table."""

    rows_format = "arrow"

    states = (
        ValueState("count", "long"),
        ValueState("last", "long"),
        ListState("recent", "long", ttl=TTL(f"{RECENT_TTL_MS} ms")),
        MapState("buckets", "long", "long", ttl=TTL(f"{BUCKETS_TTL_MS} ms")),
    )
    timers = False

    def process(self, key: Any, rows: Any, ctx: Any) -> Any:
        if not ctx.timers():
            ctx.register_processing_time_timer(ctx.processing_time + PING_MS)
        assert rows.schema.field("ts").type.tz == "UTC", rows.schema
        return self.judge(key, [ms(t) for t in rows.column("ts").to_pylist()], rows.column("amount").to_pylist(), ctx)

    def on_timer(self, key: Any, timer: Any, ctx: Any) -> Any:
        return [("ping", key[0], timer.timestamp, ctx.state("count").get(), -1, -1)]


def spark_processor(ttl: bool) -> Any:
    """:class:`Silence` (``ttl`` false) or :class:`Recent` as Spark's ``StatefulProcessor`` (a class made
    here: pyspark is imported lazily)."""
    from pyspark.sql.streaming import StatefulProcessor

    class _Silence(StatefulProcessor):  # type: ignore[misc]
        def init(self, handle: Any) -> None:
            self.handle = handle
            self.count = handle.getValueState("count", "value LONG")
            self.last = handle.getValueState("last", "value LONG")
            self.recent = handle.getListState("recent", "value LONG", RECENT_TTL_MS if ttl else None)
            self.buckets = handle.getMapState("buckets", "value LONG", "value LONG", BUCKETS_TTL_MS if ttl else None)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[pd.DataFrame]:  # noqa: N802
            frame = pd.concat(list(rows))
            amounts = [int(a) for a in frame["amount"]]
            n = (self.count.get()[0] if self.count.exists() else 0) + len(amounts)
            self.count.update((n,))
            survived = len(list(self.recent.get()))
            self.recent.appendList([(a,) for a in amounts])
            for a in amounts:
                held = self.buckets.getValue((a % 3,))
                self.buckets.updateValue((a % 3,), ((held[0] if held else 0) + 1,))
            newest = max(map(ms, frame["ts"]))
            last = self.last.get()[0] if self.last.exists() else None
            if ttl and not list(self.handle.listTimers()):
                self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + PING_MS)
            if last is None or newest > last:
                if last is not None and not ttl:
                    self.handle.deleteTimer(last + SILENCE)
                self.last.update((newest,))
                if not ttl:
                    self.handle.registerTimer(newest + SILENCE)
            total = sum(v[0] for v in self.buckets.values())
            yield pd.DataFrame([("rows", key[0], newest, n, survived, total)], columns=COLUMNS)

        def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:  # noqa: N802
            n = self.count.get()[0]
            if ttl:
                yield pd.DataFrame([("ping", key[0], expiredTimerInfo.getExpiryTimeInMs(), n, -1, -1)], columns=COLUMNS)
                return
            self.count.clear()
            self.last.clear()
            yield pd.DataFrame([("silent", key[0], expiredTimerInfo.getExpiryTimeInMs(), n, -1, -1)], columns=COLUMNS)

        def close(self) -> None:
            pass

    return _Silence()


class SparkQuery:
    """Spark's query over its copy of the files, one ``availableNow`` run per increment, in a session of
    its own with the RocksDB state store: event time with the watermark (``ttl`` false), else
    processing time."""

    def __init__(self, spark: Any, tmp: Path, ttl: bool) -> None:
        self.spark, self.ttl = spark.newSession(), ttl
        self.spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
        self.spark.conf.set("spark.sql.shuffle.partitions", "1")
        # RocksDB's checkpoint casts the file system to the checksummed LocalFileSystem: not our raw one
        self.spark.conf.set("fs.file.impl", "org.apache.hadoop.fs.LocalFileSystem")
        self.spark.conf.set("fs.file.impl.disable.cache", "true")
        if ttl:  # in processing time every batch asks for another one: availableNow would never end
            self.spark.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        self.source, self.checkpoint = str(tmp / "spark_in"), tmp / f"spark_ck_{'ttl' if ttl else 'timers'}"
        self.rows: list[tuple[Any, ...]] = []

    def run(self) -> list[dict[str, int]]:
        """One increment; the offset log's metadata of the batches it ran (batch timestamp, watermark)."""
        done = len(self.batches())
        events = self.spark.readStream.schema(SCHEMA).json(self.source)
        if not self.ttl:
            events = events.withWatermark("ts", "10 minutes")
        mode = "ProcessingTime" if self.ttl else "EventTime"
        query = (
            events.groupBy("user")
            .transformWithStateInPandas(spark_processor(self.ttl), OUTPUT, "Append", mode)
            .writeStream.outputMode("append")
            .foreachBatch(lambda batch, _: self.rows.extend(tuple(r) for r in batch.collect()))
            .option("checkpointLocation", str(self.checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(300)
        assert not query.isActive, "Spark's availableNow run did not end"
        return self.batches()[done:]

    def batches(self) -> list[dict[str, int]]:
        offsets = self.checkpoint / "offsets"
        files = sorted((p for p in offsets.glob("*") if p.name.isdigit()), key=lambda p: int(p.name))
        return [json.loads(p.read_text().splitlines()[1]) for p in files] if offsets.exists() else []


def increment(n: int, rng: random.Random) -> list[dict[str, Any]]:
    """Increment ``n``: times around minute ``20 n``, up to 12 minutes out of order, some late by 15 to
    40 minutes, on whole and half minutes (so timers and the watermark tie); user ``c`` only in the
    first (its timer then fires once the watermark passes it)."""
    rows = []
    for i in range(14):
        minute = 20 * n + rng.randrange(-12, 8) - (rng.randrange(15, 40) if i % 5 == 4 else 0)
        ts = T0 + datetime.timedelta(minutes=max(minute, 0), seconds=rng.choice((0, 0, 30)))
        rows.append(
            {"user": rng.choice("abc" if n == 1 else "ab"), "ts": ts.isoformat(), "amount": rng.randrange(1, 50)}
        )
    return rows


def declare(tmp: Path) -> None:
    events = FileSource("events", str(tmp / "ours"), "json", SCHEMA)
    alerts = KeyedProcess("silence", events, ["user"], Silence(), watermark=("ts", "10 minutes"))
    ParquetTableSink("alerts", alerts, str(tmp / "alerts"), mode="append", step="process")
    recent = KeyedProcess("recent", events, ["user"], Recent())
    ParquetTableSink("recent_out", recent, str(tmp / "recent"), mode="append", step="process")


def test_keyed_process_equals_spark_transform_with_state_after_every_increment(spark: Any, tmp_path: Path) -> None:
    job = make_job(spark, tmp_path, declare)
    timers, expiring = SparkQuery(spark, tmp_path, ttl=False), SparkQuery(spark, tmp_path, ttl=True)
    rng, top, watermark = random.Random(43), None, None
    expected_late: list[tuple[Any, ...]] = []
    ties, calls, clock = 0, [], 0
    for n in range(1, INCREMENTS + 1):
        rows = increment(n, rng)
        if n == WAIT_BEFORE:  # Spark's next data batch is planned once recent's TTL has run out
            while time.time() * 1000 <= clock + RECENT_TTL_MS:
                time.sleep(0.05)
        write_json(tmp_path / "spark_in" / f"e{n}.json", rows)
        seen = len(timers.rows), len(expiring.rows)
        batches = timers.run()
        assert batches[0]["batchWatermarkMs"] == (watermark or 0), f"Spark's watermark before increment {n}"
        (batch,) = expiring.run()  # one batch: no no-data batch in processing time
        clock = batch["batchTimestampMs"]
        write_json(tmp_path / "ours" / f"e{n}.json", rows)
        completed = job.checkpoint(now=clock / 1000)  # our trigger time is Spark's batch time

        times = [ms(r["ts"]) for r in rows]
        expected_late += [
            ("late", r["user"], t, -1, -1, -1)
            for r, t in zip(rows, times, strict=True)
            if watermark is not None and t <= watermark
        ]
        top = max(times) if top is None else max(top, *times)
        watermark = top - BOUND if watermark is None else max(watermark, top - BOUND)
        progress = completed.operators["silence"].event_time
        assert progress is not None and progress.watermark == watermark, f"our watermark after increment {n}"
        if len(batches) > 1:  # the no-data batch
            assert batches[-1]["batchWatermarkMs"] == watermark, f"Spark's watermark after increment {n}"

        ours = list(table(tmp_path / "alerts")[COLUMNS].itertuples(index=False, name=None))
        assert sorted(r for r in ours if r[0] == "late") == sorted(expected_late), f"late rows, increment {n}"
        assert sorted(r for r in ours if r[0] != "late") == sorted(timers.rows), f"timers, increment {n}"
        ours = list(table(tmp_path / "recent")[COLUMNS].itertuples(index=False, name=None))
        assert sorted(ours) == sorted(expiring.rows), f"TTL, increment {n}"
        ties += sum(1 for r in timers.rows[seen[0] :] if r[0] == "silent" and r[2] == watermark)
        calls.append({r[1]: (r[3], r[4], r[5]) for r in expiring.rows[seen[1] :] if r[0] == "rows"})
    assert {r[0] for r in timers.rows} == {"rows", "silent"}
    assert {r[0] for r in expiring.rows} == {"rows", "ping"}, "processing-time timers fired after the wait"
    assert expected_late, "the data must have rows behind the watermark"
    assert ties, "a timer must have fired at exactly the watermark (due at timer <= watermark, in both)"
    before, after = calls[WAIT_BEFORE - 2], calls[WAIT_BEFORE - 1]
    both = set(before) & set(after)
    assert both, "a user with rows on both sides of the wait"
    assert all(after[u][1] == 0 for u in both), "recent's entries expired during the wait"
    assert all(after[u][2] == after[u][0] for u in both), "buckets (a 1-hour TTL) kept every row across the wait"
