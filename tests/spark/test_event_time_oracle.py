"""Windows against Spark Structured Streaming's own: the same rows, cut into the same increments.

Our pipeline runs one checkpoint per increment. Spark runs ``withWatermark`` + ``groupBy(window
| session_window, user)`` over the same files with ``Trigger.AvailableNow`` once per increment:
it processes the increment in one micro-batch, then runs the no-data batch the advanced
watermark asks for. That pair is what one of our checkpoints does (rows judged against the
previous watermark, windows closed by the new one emitted at once), so after every increment
the tables must be equal, not only at the end. Spark has no ``allowed_lateness``: it is 0 here.
"""

from __future__ import annotations

import datetime
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_checkpoint.dataflow import (
    FileSource,
    ParquetTableSink,
    WindowAggregate,
    session,
    sliding,
    tumbling,
)
from airflow_provider_checkpoint.testing.inprocess import make_job
from tests.spark.helpers import write_json

pytestmark = pytest.mark.spark

SCHEMA = "user STRING, ts TIMESTAMP, amount LONG"
T0 = datetime.datetime(2026, 3, 1, tzinfo=datetime.UTC)
AGGS = {"clicks": "count", "total": "sum(amount)", "biggest": "max(amount)"}
INCREMENTS = 3


def increment(n: int, rng: random.Random) -> list[dict[str, Any]]:
    """Increment ``n``: times around minute ``20 n`` up to 12 minutes out of order, some late by
    15 to 40 minutes (behind the 10-minute watermark), on whole minutes so windows and sessions
    touch and tie."""
    rows = []
    for i in range(14):
        minute = 20 * n + rng.randrange(-12, 8)
        if i % 5 == 4:
            minute -= rng.randrange(15, 40)
        ts = T0 + datetime.timedelta(minutes=max(minute, 0), seconds=rng.choice((0, 0, 30)))
        rows.append({"user": rng.choice("abc"), "ts": ts.isoformat(), "amount": rng.randrange(1, 50)})
    return rows


def pipeline(tmp: Path) -> None:
    events = FileSource("events", str(tmp / "ours"), "json", SCHEMA)
    shapes = {"tumbling": tumbling("5 minutes"), "sliding": sliding("10 minutes", "5 minutes")}
    for name, window in shapes.items():
        emit = "final" if name == "tumbling" else "update"
        agg = WindowAggregate(
            f"{name}_agg", events, ["user"], "ts", window, AGGS, watermark=("ts", "10 minutes"), emit=emit
        )
        keys = ["user", "window_start", "window_end"]
        mode = "append" if emit == "final" else "upsert"
        sink_keys = keys if mode == "upsert" else None
        ParquetTableSink(f"{name}_out", agg, str(tmp / name), mode=mode, keys=sink_keys, step="windows")
    sessions = WindowAggregate(
        "session_agg", events, ["user"], "ts", session("5 minutes"), AGGS, watermark=("ts", "10 minutes")
    )
    ParquetTableSink("session_out", sessions, str(tmp / "session"), mode="append", step="windows")  # one step


class SparkQuery:
    """One Spark Structured Streaming query, run with ``Trigger.AvailableNow`` per increment; its
    batches are collected (append: every row; update: the latest row of each window)."""

    def __init__(self, spark: Any, tmp: Path, name: str, window: Callable[[], Any], mode: str) -> None:
        self.spark, self.source, self.mode = spark, tmp / "spark_in", mode
        self.checkpoint = str(tmp / f"spark_ck_{name}")
        self.window = window
        self.rows: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self.appended: list[tuple[Any, ...]] = []

    def run(self) -> None:
        from pyspark.sql import functions as F

        events = self.spark.readStream.schema(SCHEMA).json(str(self.source)).withWatermark("ts", "10 minutes")
        windows = events.groupBy(self.window().alias("w"), "user").agg(
            F.count(F.lit(1)).alias("clicks"), F.sum("amount").alias("total"), F.max("amount").alias("biggest")
        )

        def collect(batch: Any, _: int) -> None:
            for r in batch.select(*_normalized("w.start", "w.end")).collect():
                if self.mode == "append":
                    self.appended.append(tuple(r))
                else:
                    self.rows[tuple(r)[:3]] = tuple(r)

        query = (
            windows.writeStream.outputMode(self.mode)
            .foreachBatch(collect)
            .option("checkpointLocation", self.checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    def table(self) -> list[tuple[Any, ...]]:
        return sorted(self.appended if self.mode == "append" else self.rows.values(), key=str)


def _normalized(start: str, end: str) -> list[Any]:
    """user, window start and end in microseconds, the aggregates: one comparable row shape."""
    from pyspark.sql import functions as F

    return [
        "user",
        F.unix_micros(F.col(start)).alias("start"),
        F.unix_micros(F.col(end)).alias("end"),
        "clicks",
        "total",
        "biggest",
    ]


def ours(spark: Any, path: Path) -> list[tuple[Any, ...]]:
    if not path.exists():
        return []
    rows = spark.read.parquet(str(path)).select(*_normalized("window_start", "window_end")).collect()
    return sorted((tuple(r) for r in rows), key=str)


def test_windows_equal_spark_structured_streaming_after_every_increment(spark, tmp_path):
    from pyspark.sql import functions as F

    job = make_job(spark, tmp_path, pipeline)
    queries = {
        "tumbling": SparkQuery(spark, tmp_path, "tumbling", lambda: F.window("ts", "5 minutes"), "append"),
        "sliding": SparkQuery(spark, tmp_path, "sliding", lambda: F.window("ts", "10 minutes", "5 minutes"), "update"),
        "session": SparkQuery(spark, tmp_path, "session", lambda: F.session_window("ts", "5 minutes"), "append"),
    }
    rng, late = random.Random(50), 0
    for n in range(1, INCREMENTS + 1):
        rows = increment(n, rng)
        write_json(tmp_path / "ours" / f"e{n}.json", rows)
        write_json(tmp_path / "spark_in" / f"e{n}.json", rows)
        steps = job.checkpoint().stats["steps"].values()
        late += sum(step.get("late_rows_dropped", 0) for step in steps)
        for name, query in queries.items():
            query.run()
            assert ours(spark, tmp_path / name) == query.table(), f"{name} differs after increment {n}"
    assert all(query.table() for query in queries.values()), "every shape must have emitted windows"
    assert late > 0, "the data must have rows behind the watermark"
