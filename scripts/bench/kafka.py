"""KafkaSource: a checkpoint reading a topic's new records, against one consumer reading the same ranges.

Starts the Kafka broker the tests use (Apache Kafka, :func:`tests.servers.kafka.apache_kafka`)
(its log on local disk) and a topic of 4 partitions. Per round, ``records`` small JSON records
are produced, then:

- **checkpoint**: one checkpoint of ``KafkaSource`` → ``ParquetTableSink`` (append) in the
  provider's embedded session: trigger (end offsets), the step (read on the executors, parse,
  write) and finalize;
- **floor**: one ``confluent-kafka`` consumer in this process reading the same offset ranges,
  touching every value (no parsing, no writing), measured right after the checkpoint.

Every round's table is checked: each produced record exactly once (count, and no offset twice).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

from bench.inprocess import machine_facts, start_spark
from bench.measure import CpuMeter, elapsed, log

REPO = Path(__file__).resolve().parents[2]
PARTITIONS = 4


def _produce(broker: Any, topic: str, n: int, seed: int) -> None:
    rng = random.Random(seed)
    rows = (
        (
            i % PARTITIONS,
            None,
            json.dumps({"user": f"u{rng.randrange(100_000)}", "page": f"/p{i % 50}", "ts": i}).encode(),
        )
        for i in range(n)
    )
    broker.produce(topic, rows, **{"batch.size": 1_000_000, "linger.ms": 50})


def _floor(config: dict[str, str], ranges: dict[tuple[str, int], tuple[int, int]]) -> tuple[float, int]:
    """Seconds for one consumer to read ``ranges`` (touching every value), and the records read."""
    from confluent_kafka import Consumer, TopicPartition

    from airflow_provider_checkpoint.connectors.kafka.client import consumer_config

    started = time.perf_counter()
    consumer = Consumer(consumer_config(config))
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


def run(records: int, rounds: int, work: Path, seed: int) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    from airflow_provider_checkpoint.connectors.kafka.offsets import Offsets
    from airflow_provider_checkpoint.dataflow import KafkaSource, ParquetTableSink
    from airflow_provider_checkpoint.testing.inprocess import make_job
    from tests.servers.kafka import apache_kafka

    root = work / "kafka"
    root.mkdir(parents=True, exist_ok=True)
    (work / "run").mkdir(parents=True, exist_ok=True)
    broker = apache_kafka(root)
    load_before, cpu_all = os.getloadavg(), CpuMeter()
    topic = f"bench-{seed}"
    try:
        broker.create_topic(topic, PARTITIONS)
        os.environ["AIRFLOW_CONN_BENCH_KAFKA"] = broker.uri()
        spark, session_seconds = start_spark()

        def declare(tmp: Path) -> None:
            events = KafkaSource(
                "events", [topic], kafka_config_id="bench_kafka", schema="user STRING, page STRING, ts LONG"
            )
            ParquetTableSink("events_table", events, str(tmp / "events"), mode="append")

        job = make_job(spark, root / f"job-{time.time_ns()}", declare)
        _produce(broker, topic, 10_000, seed)  # warm-up: Python workers, the reader's imports, the JIT
        job.checkpoint()
        produced, out, problems = 10_000, [], []
        for n in range(1, rounds + 1):
            _produce(broker, topic, records, seed + n)
            produced += records
            started = time.perf_counter()
            completed = job.checkpoint()
            seconds = elapsed(started)
            previous = job.coordinator.store.load(completed.checkpoint_id - 1).source_positions["events"]
            ranges = {
                tp: (s, e)
                for tp, s, e in Offsets.parse(completed.source_positions["events"]).ranges(Offsets.parse(previous))
            }
            floor, read = _floor(broker.config(), ranges)
            table = ds.dataset(str(job.tmp / "events"), format="parquet").to_table(columns=["partition", "offset"])
            if table.num_rows != produced or len(set(zip(*table.to_pydict().values(), strict=True))) != produced:
                problems.append(f"round {n}: {table.num_rows} rows in the table, {produced} produced")
            timing = job.timings[-1]
            out.append(
                {"round": n, "records": completed.stats["records_in"], "checkpoint_s": seconds, "floor_s": floor,
                 "floor_records": read, **{f"{k}_s": v for k, v in timing.items()}}
            )  # fmt: skip
            log(f"round {n}: {records:,} records, checkpoint {seconds:.2f}s (trigger {timing['trigger']:.2f}, "
                f"steps {timing['steps']:.2f}, finalize {timing['finalize']:.2f}), floor {floor:.2f}s")  # fmt: skip
    finally:
        broker.stop()
    return {
        "machine": machine_facts(spark, session_seconds),
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "other_processes_cores": round(cpu_all.stop()[1], 2),
        "rounds": out,
        "problems": problems,
    }


def render(result: dict[str, Any]) -> str:
    from bench.report import machine_lines

    rounds = result["rounds"]
    lines = [
        f"### Kafka source: a checkpoint against one consumer ({rounds[0]['records']:,} records a round, "
        f"{PARTITIONS} partitions)",
        "",
        *machine_lines(result),
        "- Broker: Apache Kafka from `tests/servers/kafka.py` (single-node KRaft, local disk) on 127.0.0.1; "
        "small JSON records "
        "`{user, page, ts}` produced before each round; the topic grows by one round's records each round.",
        "- **checkpoint**: `KafkaSource` → `ParquetTableSink` (append), trigger + step + finalize in the embedded "
        "session (`local[2]`): end offsets by fetch, the ranges read by one consumer per partition on the "
        "executors, JSON parsed by Spark, Parquet written and committed.",
        "- **floor**: one `confluent-kafka` consumer in the driver process reading the same offset ranges, "
        "touching each value (no parsing, no writing).",
        "",
        "| round | records | checkpoint s | trigger s | steps s | finalize s | floor s | checkpoint / floor rate "
        "(target ≥ 0.6) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rounds:
        lines.append(
            f"| {r['round']} | {r['records']:,} | {r['checkpoint_s']:.2f} | {r['trigger_s']:.2f} | {r['steps_s']:.2f} "
            f"| {r['finalize_s']:.2f} | {r['floor_s']:.2f} | {r['floor_s'] / r['checkpoint_s']:.2f} |"
        )
    lines += [
        "",
        "Each round's table holds every produced record exactly once: "
        f"{'yes' if not result['problems'] else '; '.join(result['problems'])}.",
    ]
    return "\n".join(lines)
