"""KafkaSource against Structured Streaming's own Kafka source, and one consumer reading the same ranges.

Starts the Kafka broker the tests use (Apache Kafka, :func:`tests.servers.kafka.apache_kafka`)
(its log on local disk) and a topic of 4 partitions. Per round, ``records`` small JSON records
are produced, then, one after the other in one embedded Spark session (``local[2]``):

- **checkpoint**: one checkpoint of ``KafkaSource`` → per-user totals (``KeyedAggregate``: count,
  last ``ts``) → ``ParquetTableSink`` (upsert): trigger (end offsets), the step (read on the
  executors, parse, aggregate, write state and table) and finalize;
- **ss**: the same aggregation as a Structured Streaming query over Spark's own Kafka source
  (``spark-sql-kafka-0-10``, fetched by ``scripts/install_spark_kafka.sh``), started once per round
  with ``Trigger.AvailableNow`` on the RocksDB state store, ``update`` output merged into a Parquet
  table by ``foreachBatch`` (a new full table version per batch, published by a symlink swap), as a
  user scheduling it from Airflow would run it;
- **floor**: one ``confluent-kafka`` consumer in this process reading the same offset ranges (the
  reader's fetch size), touching every value (no parsing, no writing), measured right after the checkpoint.

Every round is checked: both totals tables equal the totals counted here from the produced records
(each record counted once, none missing).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow.dataset as ds

from bench.inprocess import start_run
from bench.measure import elapsed, log, settle
from bench.sides import STORES, VersionedTable

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REPO = Path(__file__).resolve().parents[2]
PARTITIONS = 4
USERS = 100_000
SCHEMA = "user STRING, page STRING, ts LONG"


def spark_kafka_jars() -> list[str]:
    """The jars of Spark's Kafka source that ``scripts/install_spark_kafka.sh`` fetched (it is run if missing)."""
    import pyspark

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    found = cache / "airflow-provider-checkpoint" / f"spark-kafka-{pyspark.__version__}"
    if not (found / ".complete").exists():
        os.system(f"bash {REPO / 'scripts' / 'install_spark_kafka.sh'}")  # noqa: S605 - our own script
    jars = sorted(str(j) for j in found.glob("*.jar"))
    if not jars:
        raise RuntimeError(f"no spark-sql-kafka jars in {found}: run scripts/install_spark_kafka.sh")
    return jars


def _produce(broker: Any, topic: str, n: int, seed: int, totals: dict[str, tuple[int, int]]) -> None:
    """``n`` records into the topic; ``totals`` (user → count, last ts) counted here, the ground truth."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        user = f"u{rng.randrange(USERS)}"
        count, last = totals.get(user, (0, -1))
        totals[user] = (count + 1, max(last, seed * 10_000_000 + i))
        rows.append(
            (
                i % PARTITIONS,
                None,
                json.dumps({"user": user, "page": f"/p{i % 50}", "ts": seed * 10_000_000 + i}).encode(),
            )
        )
    broker.produce(topic, rows, **{"batch.size": 1_000_000, "linger.ms": 50})


def _floor(config: dict[str, str], ranges: dict[tuple[str, int], tuple[int, int]]) -> tuple[float, int]:
    """Seconds for one consumer to read ``ranges`` (touching every value), and the records read."""
    from confluent_kafka import Consumer, TopicPartition

    from airflow_provider_checkpoint.connectors.kafka.client import consumer_config
    from airflow_provider_checkpoint.connectors.kafka.reader import FETCH_BYTES

    started = time.perf_counter()
    consumer = Consumer({**consumer_config(config), "max.partition.fetch.bytes": FETCH_BYTES})
    consumer.assign([TopicPartition(t, p, s) for (t, p), (s, e) in ranges.items() if e > s])
    left = {tp: e for tp, (s, e) in ranges.items() if e > s}
    read, size = 0, 0
    while left:
        for message in consumer.consume(num_messages=10_000, timeout=1.0):
            if message.error():
                continue
            tp = (message.topic(), message.partition())
            if tp in left and message.offset() < left[tp]:
                size += len(message.value() or b"")
                read += 1
                if message.offset() == left[tp] - 1:
                    del left[tp]
    consumer.close()
    return elapsed(started), read


class StreamingKafka:
    """The same aggregation as a Structured Streaming query over Spark's Kafka source, one ``availableNow``
    run per call of :meth:`run` (RocksDB state store, ``update`` output merged by ``foreachBatch``)."""

    def __init__(self, spark: SparkSession, servers: str, topic: str, root: Path) -> None:
        self.spark, self.servers, self.topic = spark, servers, topic
        self.checkpoint = root / "checkpoint"
        self.published = VersionedTable(root)

    def run(self) -> tuple[float, int]:
        """Seconds of one ``availableNow`` run (query start to termination) and the records it read."""
        from pyspark.sql import functions as F

        records = (
            self.spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", self.servers)
            .option("subscribe", self.topic)
            .option("startingOffsets", "earliest")
            .option("kafka.isolation.level", "read_committed")  # as KafkaSource reads
            .load()
            .select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("v"))
            .select("v.*")
        )
        totals = records.groupBy("user").agg(F.count(F.lit(1)).alias("n"), F.max("ts").alias("last_ts"))
        writer = (
            totals.writeStream.outputMode("update")
            .option("checkpointLocation", str(self.checkpoint))
            .trigger(availableNow=True)
            .foreachBatch(lambda batch, batch_id: self.published.merge(batch, batch_id, None, 4))
        )
        for key, value in STORES["rocksdb"].items():
            self.spark.conf.set(key, value)
        started = time.perf_counter()
        query = writer.start()
        query.awaitTermination()
        seconds = elapsed(started)
        return seconds, sum(p.numInputRows for p in query.recentProgress)

    def output(self) -> pd.DataFrame:
        return ds.dataset(str(self.published.table / ""), format="parquet").to_table().to_pandas()


def _totals_match(got: pd.DataFrame, totals: dict[str, tuple[int, int]]) -> bool:
    """Whether ``got`` (user, n, last_ts) holds exactly ``totals``."""
    rows = {(u, int(n), int(t)) for u, n, t in got[["user", "n", "last_ts"]].itertuples(index=False, name=None)}
    return len(got) == len(totals) and rows == {(u, n, t) for u, (n, t) in totals.items()}


def run(records: int, rounds: int, work: Path, seed: int) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    from airflow_provider_checkpoint.connectors.kafka.offsets import Offsets
    from airflow_provider_checkpoint.dataflow import KafkaSource, KeyedAggregate, ParquetTableSink
    from airflow_provider_checkpoint.testing.inprocess import make_job
    from tests.servers.kafka import apache_kafka

    root = work / "kafka"
    (work / "run").mkdir(parents=True, exist_ok=True)
    bench = start_run(root, {"spark.jars": ",".join(spark_kafka_jars())})  # clears root, starts the session
    spark = bench.spark
    root.mkdir(parents=True)
    broker = apache_kafka(root)
    topic = f"bench-{seed}"
    totals: dict[str, tuple[int, int]] = {}
    try:
        broker.create_topic(topic, PARTITIONS)
        os.environ["AIRFLOW_CONN_BENCH_KAFKA"] = broker.uri()

        def declare(tmp: Path) -> None:
            events = KafkaSource("events", [topic], kafka_config_id="bench_kafka", schema=SCHEMA)
            users = KeyedAggregate("totals", events, keys=["user"], aggs={"n": "count", "last_ts": "max(ts)"})
            ParquetTableSink("totals_table", users, str(tmp / "totals"), mode="upsert", keys=["user"])

        job = make_job(spark, root / f"job-{time.time_ns()}", declare)
        streaming = StreamingKafka(spark, broker.servers, topic, root / "ss")
        _produce(broker, topic, 10_000, seed, totals)  # warm-up: Python workers, the reader's imports, the JIT
        job.checkpoint()
        streaming.run()
        out, problems = [], []
        for n in range(1, rounds + 1):
            _produce(broker, topic, records, seed + n, totals)
            settle(spark)
            started = time.perf_counter()
            completed = job.checkpoint()
            seconds = elapsed(started)
            previous = job.coordinator.store.load(completed.checkpoint_id - 1).source_positions["events"]
            ranges = {
                tp: (s, e)
                for tp, s, e in Offsets.parse(completed.source_positions["events"]).ranges(Offsets.parse(previous))
            }
            floor, read = _floor(broker.config(), ranges)
            settle(spark)
            ss_seconds, ss_records = streaming.run()
            ours = ds.dataset(str(job.tmp / "totals"), format="parquet").to_table().to_pandas()
            for side, got in (("ours", ours), ("ss", streaming.output())):
                if not _totals_match(got, totals):
                    problems.append(f"round {n}: the {side} totals differ from the produced records' totals")
            if ss_records != records:
                problems.append(f"round {n}: Structured Streaming read {ss_records} records, {records} produced")
            timing = job.timings[-1]
            out.append(
                {"round": n, "records": completed.stats["records_in"], "checkpoint_s": seconds, "ss_s": ss_seconds,
                 "floor_s": floor, "floor_records": read, **{f"{k}_s": v for k, v in timing.items()}}
            )  # fmt: skip
            log(f"round {n}: {records:,} records, checkpoint {seconds:.2f}s (trigger {timing['trigger']:.2f}, "
                f"steps {timing['steps']:.2f}, finalize {timing['finalize']:.2f}), ss {ss_seconds:.2f}s, "
                f"floor {floor:.2f}s")  # fmt: skip
        finished = bench.finish()
    finally:
        broker.stop()
    return {**finished, "rounds": out, "problems": problems}


def render(result: dict[str, Any]) -> str:
    from bench.report import machine_lines

    rounds = result["rounds"]
    lines = [
        f"### Kafka source: a checkpoint against Structured Streaming's Kafka source and one consumer "
        f"({rounds[0]['records']:,} records a round, {PARTITIONS} partitions)",
        "",
        *machine_lines(result),
        "- Broker: Apache Kafka from `tests/servers/kafka.py` (single-node KRaft, local disk) on 127.0.0.1; "
        f"small JSON records `{{user, page, ts}}` ({USERS:,} users) produced before each round; the topic grows "
        "by one round's records each round. One embedded session (`local[2]`) runs both sides, one after the "
        "other.",
        "- **checkpoint**: `KafkaSource` → per-user totals (`KeyedAggregate`: count, last `ts`) → `ParquetTableSink` "
        "(upsert); trigger + step + finalize: end offsets by fetch, the ranges read by one consumer per partition "
        "on the executors, JSON parsed by Arrow where it gives `from_json`'s answer (else by Spark), keyed state "
        "and the Parquet table written and committed.",
        "- **ss**: the same totals as a Structured Streaming query over Spark's own Kafka source "
        "(`spark-sql-kafka-0-10_2.13` of the pinned Spark, from Maven Central), started once per round with "
        "`Trigger.AvailableNow`, RocksDB state store (changelog checkpointing), `update` output merged into a "
        "Parquet table by `foreachBatch` (a new full table version per batch).",
        "- **floor**: one `confluent-kafka` consumer in the driver process reading the same offset ranges, "
        "touching each value (no parsing, no writing).",
        "",
        "| round | records | checkpoint s | trigger s | steps s | finalize s | ss s | checkpoint / ss (target ≤ 0.5) "
        "| floor s | floor / checkpoint |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rounds:
        lines.append(
            f"| {r['round']} | {r['records']:,} | {r['checkpoint_s']:.2f} | {r['trigger_s']:.2f} | {r['steps_s']:.2f} "
            f"| {r['finalize_s']:.2f} | {r['ss_s']:.2f} | {r['checkpoint_s'] / r['ss_s']:.2f} | {r['floor_s']:.2f} "
            f"| {r['floor_s'] / r['checkpoint_s']:.2f} |"
        )
    lines += [
        "",
        "Both sides' totals equal the totals counted from the produced records after every round (each record "
        f"once): {'; '.join(result['problems']) or 'yes'}.",
    ]
    return "\n".join(lines)
