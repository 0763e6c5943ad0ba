"""KafkaSink against one idempotent producer publishing the same records.

Starts the Kafka broker the tests use (Apache Kafka, :func:`tests.servers.kafka.apache_kafka`) with
two topics of 4 partitions. Per round, ``records`` small rows ``{user, page, ts}`` land as one JSON
file, then, one after the other:

- **checkpoint**: one checkpoint of ``FileSource`` → ``KafkaSink`` (key ``user``, JSON values) in one
  embedded Spark session (``local[2]``): trigger, the step (read, stage the records in the checkpoint)
  and finalize (one Kafka transaction producing them with the published marker);
- **floor**: one ``confluent-kafka`` producer in this process with ``enable.idempotence`` producing the
  same keys and values (already encoded here, so the floor pays no reading and no encoding) and
  flushing;
- **floor with read**: what a plain producer program pays for the same input: read the round's JSON file
  (pyarrow's JSON reader, the schema given), encode each row's key and JSON value, produce and flush —
  the same read the checkpoint's step pays, so the two sides compare on equal terms.

Every round is checked: a ``read_committed`` consumer finds in the sink's topic exactly the rows
landed so far (each once, none missing), compared as parsed JSON.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from bench.inprocess import start_run
from bench.measure import elapsed, log, settle

REPO = Path(__file__).resolve().parents[2]
PARTITIONS = 4
USERS = 100_000
SCHEMA = "user STRING, page STRING, ts LONG"


def _land(landing: Path, n: int, seed: int) -> list[dict[str, Any]]:
    """One JSON file of ``n`` rows in ``landing`` (``r<seed>.json``, written aside, then renamed); the rows."""
    rng = random.Random(seed)
    rows = [{"user": f"u{rng.randrange(USERS)}", "page": f"/p{i % 50}", "ts": seed * 10_000_000 + i} for i in range(n)]
    part = landing / f".r{seed}.json"
    part.write_text("".join(json.dumps(r) + "\n" for r in rows))
    part.rename(landing / f"r{seed}.json")
    return rows


def _encoded(rows: list[dict[str, Any]]) -> list[tuple[bytes, bytes]]:
    return [(r["user"].encode(), json.dumps(r, separators=(",", ":")).encode()) for r in rows]


def _read(path: Path) -> list[tuple[bytes, bytes]]:
    """The file's rows read as a plain program would (pyarrow's JSON reader, the schema given), encoded."""
    import pyarrow as pa
    from pyarrow import json as pj

    schema = pa.schema([("user", pa.string()), ("page", pa.string()), ("ts", pa.int64())])
    table = pj.read_json(path, parse_options=pj.ParseOptions(explicit_schema=schema))
    return _encoded(table.to_pylist())


def _floor(config: dict[str, str], topic: str, rows: list[dict[str, Any]], path: Path | None = None) -> float:
    """Seconds for one idempotent producer to produce ``rows`` and flush: encoded before the clock starts, or
    (``path``) read from that file and encoded on the clock."""
    from confluent_kafka import Producer

    producer = Producer({**config, "enable.idempotence": True, "linger.ms": 50, "batch.size": 1_000_000})
    encoded = [] if path else _encoded(rows)
    started = time.perf_counter()
    if path:
        encoded = _read(path)
    for key, value in encoded:
        while True:
            try:
                producer.produce(topic, value, key)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    left = producer.flush(60)
    if left:
        raise RuntimeError(f"the floor's producer left {left} records undelivered")
    return elapsed(started)


def _published(broker: Any, topic: str) -> list[tuple[str, str, int]]:
    from tests.servers.kafka import consume

    return sorted(
        (m.key().decode(), (v := json.loads(m.value()))["page"], v["ts"])
        for m in consume(broker, topic, "read_committed")
    )


def run(records: int, rounds: int, work: Path, seed: int) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    from airflow_provider_checkpoint.dataflow import FileSource, KafkaSink
    from airflow_provider_checkpoint.testing.inprocess import make_job
    from tests.servers.kafka import apache_kafka

    root = work / "kafka-sink"
    bench = start_run(root)  # clears root, starts the session and the measurements
    spark = bench.spark
    (root / "landing").mkdir(parents=True)
    (work / "run").mkdir(parents=True, exist_ok=True)
    broker = apache_kafka(root)
    out_topic, floor_topic = f"sink-{seed}", f"floor-{seed}"
    landed: list[tuple[str, str, int]] = []
    out: list[dict[str, Any]] = []
    problems: list[str] = []
    try:
        broker.create_topic(out_topic, PARTITIONS)
        broker.create_topic(floor_topic, PARTITIONS)
        os.environ["AIRFLOW_CONN_BENCH_KAFKA"] = broker.uri()

        def declare(tmp: Path) -> None:
            events = FileSource("events", str(root / "landing"), "json", SCHEMA)
            KafkaSink("published", events, out_topic, kafka_config_id="bench_kafka", key="user")

        job = make_job(spark, root / f"job-{time.time_ns()}", declare)
        warm = _land(root / "landing", 10_000, seed)  # warm-up: Python workers, the producer's imports, the JIT
        job.checkpoint()
        _floor(broker.config(), floor_topic, warm)
        landed += [(r["user"], r["page"], r["ts"]) for r in warm]
        for n in range(1, rounds + 1):
            rows = _land(root / "landing", records, seed + n)
            landed += [(r["user"], r["page"], r["ts"]) for r in rows]
            settle(spark)
            started = time.perf_counter()
            job.checkpoint()
            seconds = elapsed(started)
            settle(spark)
            floor = _floor(broker.config(), floor_topic, rows)
            settle(spark)
            floor_read = _floor(broker.config(), floor_topic, rows, root / "landing" / f"r{seed + n}.json")
            if _published(broker, out_topic) != sorted(landed):
                problems.append(f"round {n}: the sink's topic differs from the rows landed (read_committed)")
            timing = job.timings[-1]
            out.append({"round": n, "records": records, "checkpoint_s": seconds, "floor_s": floor,
                        "floor_read_s": floor_read, **{f"{k}_s": v for k, v in timing.items()}})  # fmt: skip
            log(f"round {n}: {records:,} records, checkpoint {seconds:.2f}s (trigger {timing['trigger']:.2f}, "
                f"steps {timing['steps']:.2f}, finalize {timing['finalize']:.2f}), floor {floor:.2f}s, "
                f"floor with read {floor_read:.2f}s")  # fmt: skip
        finished = bench.finish()
    finally:
        broker.stop()
    return {**finished, "rounds": out, "problems": problems}


def render(result: dict[str, Any]) -> str:
    from bench.report import machine_lines

    rounds = result["rounds"]
    lines = [
        f"### Kafka sink: a checkpoint against one idempotent producer ({rounds[0]['records']:,} records a round, "
        f"{PARTITIONS} partitions)",
        "",
        *machine_lines(result),
        "- Broker: Apache Kafka from `tests/servers/kafka.py` (single-node KRaft, local disk) on 127.0.0.1.",
        "- **checkpoint**: `FileSource` (one JSON file of `{user, page, ts}` a round) → `KafkaSink` (key `user`, "
        "JSON values): trigger + step (read the file, stage the records in the checkpoint) + finalize (one "
        "transaction producing them with the published marker). One embedded session (`local[2]`).",
        "- **floor**: one `confluent-kafka` producer with `enable.idempotence` producing the same keys and values, "
        "encoded before its clock starts, then flushing: no reading, no staging, no transaction.",
        "- **floor with read**: the same producer reading the round's JSON file itself (pyarrow's JSON reader, the "
        "schema given), encoding each row's key and JSON value, producing and flushing: the same read of the same "
        "input as the checkpoint's step.",
        "",
        "| round | records | checkpoint s | trigger s | steps s | finalize s | floor s | floor with read s "
        "| throughput / floor (target ≥ 0.6) | throughput / floor with read |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rounds:
        lines.append(
            f"| {r['round']} | {r['records']:,} | {r['checkpoint_s']:.2f} | {r['trigger_s']:.2f} | {r['steps_s']:.2f} "
            f"| {r['finalize_s']:.2f} | {r['floor_s']:.2f} | {r['floor_read_s']:.2f} "
            f"| {r['floor_s'] / r['checkpoint_s']:.2f} | {r['floor_read_s'] / r['checkpoint_s']:.2f} |"
        )
    lines += [
        "",
        "After every round a `read_committed` consumer finds in the sink's topic exactly the rows landed (each "
        f"once): {'; '.join(result['problems']) or 'yes'}.",
    ]
    return "\n".join(lines)
