"""State that expires, checked against Spark Structured Streaming's own answer and in the state files.

``Deduplicate(keys, within=bound)`` against Spark's ``dropDuplicatesWithinWatermark``: the same
rows, cut into the same increments, Spark's query run with ``Trigger.AvailableNow`` once per
increment (its data batch, then the no-data batch the advanced watermark asks for: what one of
our checkpoints does). After every increment both outputs must be equal, and our state must hold
exactly the keys Spark's still holds (the keys whose first-seen time plus the bound is after the
watermark). Spark ties ``within`` to the watermark's bound; ``Deduplicate`` takes any ``within``,
which Spark cannot check (the model test, ``test_ttl_model.py``, does). Differences on purpose,
stated and checked: rows without an event time, which the test keeps out of Spark's input, are
dropped and counted by ours; late rows (at or before the watermark of the previous increment),
which Spark drops, go with ``late="output"`` to ours's late-data table, which must hold exactly
the late rows worked out here with pandas from the increments, each once.

The compaction test counts the rows of the state files with pyarrow (not with our reader): once a
processing-time TTL expires most keys, compaction leaves only the live ones in the files.
"""

from __future__ import annotations

import datetime
import random
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest

from airflow_provider_checkpoint.core.model import CompletedCheckpoint
from airflow_provider_checkpoint.dataflow import TTL, Deduplicate, FileSource, KeyedAggregate, ParquetTableSink
from airflow_provider_checkpoint.testing.inprocess import Job, make_job
from tests.spark.helpers import table, write_json

pytestmark = pytest.mark.spark

SCHEMA = "user STRING, ts TIMESTAMP, amount LONG"
T0 = datetime.datetime(2026, 3, 1, tzinfo=datetime.UTC)
INCREMENTS = 4


def increment(n: int, rng: random.Random) -> list[dict[str, Any]]:
    """Increment ``n``: times around minute ``15 n``, up to 12 minutes out of order, some late by 15 to 40
    minutes (behind the 10-minute watermark), in time order within the file (Spark then keeps, of a key's
    rows in one batch, the earliest, as ours does); repeated users so duplicates abound."""
    minutes = []
    for i in range(16):
        minute = 15 * n + rng.randrange(-12, 6) - (rng.randrange(15, 40) if i % 6 == 5 else 0)
        minutes.append(max(minute, 0) * 60 + rng.choice((0, 0, 30)))
    rows = [
        {"user": rng.choice("abcdefg"), "ts": (T0 + datetime.timedelta(seconds=s)).isoformat(), "amount": i}
        for i, s in enumerate(sorted(minutes))
    ]
    return rows


def naive_utc(times: pd.Series) -> pd.Series:
    """Times (ISO strings, naive UTC or aware) as naive UTC timestamps."""
    return pd.to_datetime(times, utc=True).dt.tz_convert(None)


def late_rows(path: Path) -> list[tuple[Any, ...]]:
    """``(user, ts, amount)`` rows of a late-data table, read with pyarrow, sorted (none: no table yet)."""
    got = table(path)
    if got.empty:
        return []
    return sorted(got.assign(ts=naive_utc(got["ts"]))[["user", "ts", "amount"]].itertuples(index=False, name=None))


def pipeline(tmp: Path) -> None:
    events = FileSource("events", str(tmp / "ours"), "json", SCHEMA)
    spark_like = Deduplicate(
        "dedup", events, ["user"], within="10 minutes", watermark=("ts", "10 minutes"), late="output"
    )
    ParquetTableSink("dedup_out", spark_like, str(tmp / "dedup"), mode="append")
    ParquetTableSink("dedup_late", spark_like.late_data, str(tmp / "dedup_late"), mode="append")


def rows_of(df: Any) -> list[tuple[Any, ...]]:
    """``(user, ts µs, amount)`` rows of a Spark DataFrame, sorted."""
    from pyspark.sql import functions as F

    got = df.select("user", F.unix_micros("ts").alias("ts"), "amount").collect()
    return sorted((tuple(r) for r in got), key=str)


class SparkDedup:
    """Spark's ``dropDuplicatesWithinWatermark`` over the same files, one ``availableNow`` run per increment."""

    def __init__(self, spark: Any, tmp: Path) -> None:
        self.spark, self.source, self.checkpoint = spark, str(tmp / "spark_in"), str(tmp / "spark_ck")
        self.rows: list[tuple[Any, ...]] = []

    def run(self) -> None:
        events = self.spark.readStream.schema(SCHEMA).json(self.source).withWatermark("ts", "10 minutes")
        query = (
            events.dropDuplicatesWithinWatermark(["user"])
            .writeStream.outputMode("append")
            .foreachBatch(lambda batch, _: self.rows.extend(rows_of(batch)))
            .option("checkpointLocation", self.checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    def state_keys(self) -> set[str]:
        """The keys in Spark's state store after the last batch (the state reader data source)."""
        keys = self.spark.read.format("statestore").load(self.checkpoint).select("key.user").collect()
        return {r[0] for r in keys}


def state_keys(spark: Any, job: Job, completed: CompletedCheckpoint, uid: str) -> set[str]:
    from airflow_provider_checkpoint.state.spark_backend import read_state

    snapshot = completed.operators[uid]
    return {r[0] for r in read_state(spark, job.storage, snapshot, verify=True, uid=uid).select("user").collect()}


def test_deduplicate_equals_spark_drop_duplicates_within_watermark(spark: Any, tmp_path: Path) -> None:
    job = make_job(spark, tmp_path, pipeline)
    oracle = SparkDedup(spark, tmp_path)
    rng, late, untimed = random.Random(51), 0, 0
    watermark, expected_late = None, []
    for n in range(1, INCREMENTS + 1):
        rows = increment(n, rng)
        frame = pd.DataFrame(rows).assign(ts=lambda f: naive_utc(f["ts"]))
        if watermark is not None:
            behind = frame[frame["ts"] <= watermark][["user", "ts", "amount"]]
            expected_late += list(behind.itertuples(index=False, name=None))
        top = frame["ts"].max() - pd.Timedelta(minutes=10)
        watermark = top if watermark is None else max(watermark, top)
        write_json(tmp_path / "spark_in" / f"e{n}.json", rows)
        write_json(tmp_path / "ours" / f"e{n}.json", [*rows, {"user": "a", "ts": None, "amount": -1}])
        completed = job.checkpoint()
        steps = completed.stats["steps"].values()
        late += sum(s.get("late_rows_output", 0) for s in steps)
        untimed += sum(s.get("rows_without_event_time", 0) for s in steps)
        oracle.run()
        ours = rows_of(spark.read.parquet(str(tmp_path / "dedup")))
        assert ours == sorted(oracle.rows, key=str), f"increment {n}"
        assert state_keys(spark, job, completed, "dedup") == oracle.state_keys(), f"state after increment {n}"
        assert late_rows(tmp_path / "dedup_late") == sorted(expected_late), f"late rows after increment {n}"
        assert late == len(expected_late), f"late rows counted, increment {n}"
    assert untimed == INCREMENTS, "one row without event time per increment, dropped and counted"
    assert late > 0, "the data must have rows behind the watermark"
    assert len(ours) > len({r[0] for r in ours}), "a key must have come back after its state expired"


def test_expired_state_leaves_the_files_at_compaction(spark: Any, tmp_path: Path) -> None:
    """Checkpoint 1 lands 40 keys, later ones one new key each; a 250 s TTL (checkpoints are 100 s apart)
    expires the 40 at checkpoint 4, which writes their removal as a delta; the next checkpoint compacts
    the range (its deltas outgrew it): the files of its snapshot, counted with pyarrow, then hold the
    live keys only. An expired key that comes back (u00 at checkpoint 6) restarts from empty."""

    def declare(tmp: Path) -> None:
        events = FileSource("events", str(tmp / "in"), "json", SCHEMA)
        agg = KeyedAggregate("agg", events, ["user"], {"n": "count", "total": "sum(amount)"}, ttl="250 s")
        ParquetTableSink("out", agg, str(tmp / "out"), mode="upsert", keys=["user"])

    job = make_job(spark, tmp_path, declare, inline_state_threshold=0)  # state in files
    ts = T0.isoformat()
    write_json(tmp_path / "in" / "f01.json", [{"user": f"u{i:02d}", "ts": ts, "amount": 1} for i in range(40)])
    file_rows, live_rows = [], []
    for c in range(1, 7):
        if c > 1:
            back = [{"user": "u00", "ts": ts, "amount": 5}] if c == 6 else []
            write_json(tmp_path / "in" / f"f{c:02d}.json", [{"user": f"n{c:02d}", "ts": ts, "amount": 1}, *back])
        snapshot = job.checkpoint().operators["agg"]
        assert snapshot.inline is None
        file_rows.append(sum(pq.read_metadata(job.storage.path(h.path)).num_rows for h in snapshot.handles))
        live_rows.append(snapshot.rows)
    # a key updated at checkpoint c lives through c + 2
    assert live_rows == [40, 41, 42, 3, 3, 4], live_rows
    assert file_rows[3] > 40, f"checkpoint 4 removes the expired keys by a delta: {file_rows}"
    assert file_rows[4] == live_rows[4], f"checkpoint 5 compacts them away: {file_rows}"
    out = table(tmp_path / "out").set_index("user")
    assert (out.loc["u00", "n"], out.loc["u00", "total"]) == (1, 5), "u00 restarted from empty at checkpoint 6"
    assert out.loc["u01", "n"] == 1, "an expired key keeps its last row in the upsert sink"


def test_ttl_state_rescaled_keeps_live_keys_and_never_reads_expired_ones(
    spark: Any, tmp_path: Path, small_ranges: None
) -> None:
    """A processing-time ``ttl="250 s"`` state written in files of small key-group ranges at one Spark
    parallelism (1), taken as a savepoint, then a checkpoint on an abandoned branch renews ``u39``;
    the savepoint restored at another parallelism (5), the file landed since read again. Trigger
    times are set (``now=``), amounts differ per checkpoint, so every expected row below is worked
    out by hand from the TTL rule: a key updated at ``t`` lives while the clock is before ``t + 250 s``."""
    from airflow_provider_checkpoint.restore.requests import request_restore
    from airflow_provider_checkpoint.testing.inprocess import T0 as TRIGGER_T0

    def declare(tmp: Path) -> None:
        events = FileSource("events", str(tmp / "in"), "json", SCHEMA)
        agg = KeyedAggregate("agg", events, ["user"], {"n": "count", "total": "sum(amount)"}, ttl="250 s")
        ParquetTableSink("out", agg, str(tmp / "out"), mode="upsert", keys=["user"])

    job = make_job(spark, tmp_path, declare, inline_state_threshold=0)
    ts, previous = T0.isoformat(), spark.conf.get("spark.sql.shuffle.partitions")

    def checkpoint(at: int, users: list[str], amount: int, savepoint: str | None = None) -> set[str]:
        write_json(tmp_path / "in" / f"at{at}.json", [{"user": u, "ts": ts, "amount": amount} for u in users])
        completed = job.checkpoint(now=TRIGGER_T0 + at, savepoint_target=savepoint)
        assert len(completed.operators["agg"].handles) > 1, "several key-group ranges"
        return state_keys(spark, job, completed, "agg")

    old = [f"u{i:02d}" for i in range(40)]
    try:
        spark.conf.set("spark.sql.shuffle.partitions", "1")
        assert checkpoint(100, old, 1) == set(old)  # all expire at 350
        savepoint = f"file://{tmp_path}/savepoints/sp-2"
        assert checkpoint(200, old[:20], 2, savepoint) == set(old)  # u00..u19 now expire at 450
        assert checkpoint(300, ["u39"], 100) == set(old)  # u39 renewed to 550 on this branch only
        request_restore(job.storage, savepoint, False, False)
        spark.conf.set("spark.sql.shuffle.partitions", "5")
        # at 400 (at300.json is read again): u20..u39 expired at 350 (u39's renewal was on the abandoned
        # branch): u20 and u39 restart
        assert checkpoint(400, ["u00", "u20", "u39", "n01"], 5) == {*old[:20], "u20", "u39", "n01"}
        # at 500: u01..u19 expired at 450: u01 restarts; u00, u20, u39, n01 live until 650
        assert checkpoint(500, ["u01"], 7) == {"u00", "u01", "u20", "u39", "n01"}
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", previous)
    out = table(tmp_path / "out").set_index("user")[["n", "total"]]
    got = {u: tuple(out.loc[u]) for u in ("u00", "u01", "u02", "u20", "u21", "u39", "n01")}
    assert got == {
        "u00": (3, 8),  # 1 + 2 + 5, never expired
        "u01": (1, 7),  # restarted at 500
        "u02": (2, 3),  # expired without rows: its last row stays
        "u20": (1, 5),  # restarted at 400
        "u21": (1, 1),
        "u39": (2, 105),  # restarted at 400 with at300.json's row read again and its own
        "n01": (1, 5),
    }, got
    assert len(out) == 41


def test_deduplicate_by_processing_time_equals_pandas(spark: Any, tmp_path: Path) -> None:
    """``Deduplicate(ttl="250 s")``, on write and on read and write, against pandas: checkpoints are 100 s
    apart, so a key first seen (or, renewed, last seen) at checkpoint c is forgotten from c + 3 on."""

    def declare(tmp: Path) -> None:
        events = FileSource("events", str(tmp / "in"), "json", SCHEMA)
        on_write = Deduplicate("on_write", events, ["user"], ttl="250 s")
        ParquetTableSink("on_write_out", on_write, str(tmp / "on_write"), mode="append")
        on_read = Deduplicate("on_read", events, ["user"], ttl=TTL("250 s", update="on_read_and_write"))
        ParquetTableSink("on_read_out", on_read, str(tmp / "on_read"), mode="append")

    job = make_job(spark, tmp_path, declare)
    rng, ts = random.Random(53), T0.isoformat()
    expiry: dict[str, dict[str, int]] = {"on_write": {}, "on_read": {}}
    expected: dict[str, list[tuple[str, int]]] = {"on_write": [], "on_read": []}
    for c in range(1, 5):
        rows = [{"user": rng.choice("abcdefgh"), "ts": ts, "amount": rng.randrange(100)} for _ in range(6)]
        write_json(tmp_path / "in" / f"c{c}.json", rows)
        now = 100 * c  # the checkpoint's trigger time, from the job's first, in seconds
        firsts = pd.DataFrame(rows).groupby("user")["amount"].min()
        for uid, held in expiry.items():
            live = {u: e for u, e in held.items() if now < e}
            for user, amount in firsts.items():
                if user not in live:
                    expected[uid].append((str(user), int(amount)))
                if user not in live or uid == "on_read":
                    live[str(user)] = now + 250
            expiry[uid] = live
        job.checkpoint()
        for uid in expiry:
            got = table(tmp_path / uid)
            assert sorted(zip(got["user"], got["amount"], strict=True)) == sorted(expected[uid]), f"{uid}, {c}"
    assert len(expected["on_write"]) > len(expected["on_read"]), "renewal keeps keys: fewer repeats"
    for uid, emitted in expected.items():
        assert len({u for u, _ in emitted}) < len(emitted), f"{uid}: a key emitted again once expired"
