"""State I/O: the Python file engine vs Spark's own Parquet writer, and S3 requests per checkpoint.

**Engines** (local path, one run): the large-state workload's state after its first increment
(one row per key, ``users`` keys) is written as a full version, as a checkpoint writes it
(:func:`~airflow_provider_checkpoint.spark.state.write_full_version`: one file per key-group
range, each file's size and SHA-256 in its handle), by each engine in turn, ``rounds`` times,
alternating which goes first. Every output is read back with pyarrow and compared with the
pandas ground truth, and every handle is verified against its file.

**Requests** (the S3 server of ``tests/servers``, SeaweedFS): FileSource → KeyedAggregate →
ParquetTableSink (upsert) with landing area, table and storage root on S3 runs
``checkpoints`` checkpoints in-process (:mod:`airflow_provider_checkpoint.testing.inprocess`;
the Python engine, as the session has no S3 Hadoop filesystem). Every request of the driver
and the executors passes a counting proxy; landing the input does not. The table is checked
against a pandas ground truth at the end.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

from bench.inprocess import start_spark
from bench.measure import MB, elapsed, log
from bench.report import verdict
from bench.workloads import AGGS, SCHEMA, DataSpec, ground_truth, normalized

REPO = Path(__file__).resolve().parents[2]
KINDS = ("LIST", "GET", "HEAD", "PUT", "POST", "DELETE")


def run(spec: DataSpec, rounds: int, s3_users: int, work: Path) -> dict[str, Any]:
    load = [os.getloadavg()[0]]
    (work / "run").mkdir(parents=True, exist_ok=True)
    spark, _ = start_spark()
    engines = engines_side_by_side(spark, spec, rounds, work)
    requests = requests_per_checkpoint(spark, spec, s3_users, work)
    problems = engines["problems"] + requests["problems"]
    return {"engines": engines, "requests": requests, "problems": problems, "load": [*load, os.getloadavg()[0]]}


def engines_side_by_side(spark: Any, spec: DataSpec, rounds: int, work: Path) -> dict[str, Any]:
    import pyarrow.parquet as pq

    from airflow_provider_checkpoint.dataflow.file_io import ENGINE_CONF
    from airflow_provider_checkpoint.spark.state import write_full_version
    from airflow_provider_checkpoint.storage import Location

    truth = ground_truth(spec.increment(1))
    state = spark.createDataFrame(truth, "user STRING, events LONG, first_seen LONG, last_seen LONG").cache()
    rows = state.count()
    storage = Location.from_url(f"file://{work / 'state-io'}")
    storage.delete("")
    times: dict[str, list[float]] = {"hadoop": [], "python": []}
    sizes: dict[str, tuple[int, int]] = {}
    problems: list[str] = []
    for r in range(rounds + 1):  # round 0 warms both up, unmeasured
        for engine in ("hadoop", "python") if r % 2 else ("python", "hadoop"):
            spark.conf.set(ENGINE_CONF, engine)
            started = time.perf_counter()
            snap = write_full_version(storage, f"{engine}-{r}", state, rows, state.schema.json(), ("user",), 128)
            seconds = elapsed(started)
            if r:
                times[engine].append(seconds)
            sizes[engine] = (len(snap.handles), sum(h.size for h in snap.handles))
            for handle in snap.handles:
                storage.verify(handle)
            back = pd.concat([pq.read_table(storage.path(h.path)).to_pandas() for h in snap.handles])
            if not normalized(back).equals(truth):
                problems.append(f"{engine} round {r}: state differs from the ground truth")
            log(f"state-io: {engine} round {r}: {seconds:.2f}s, {len(snap.handles)} files")
    spark.conf.unset(ENGINE_CONF)
    state.unpersist()
    storage.delete("")
    medians = {e: statistics.median(t) for e, t in times.items()}
    return {"rows": rows, "rounds": rounds, "times": times, "medians": medians, "sizes": sizes, "problems": problems}


def requests_per_checkpoint(spark: Any, spec: DataSpec, users: int, work: Path) -> dict[str, Any]:
    import pyarrow.dataset as ds
    import s3fs

    sys.path.insert(0, str(REPO))
    from airflow_provider_checkpoint.coordinator import CheckpointCoordinator
    from airflow_provider_checkpoint.core.settings import CheckpointSettings
    from airflow_provider_checkpoint.dataflow import FileSource, KeyedAggregate, ParquetTableSink
    from airflow_provider_checkpoint.dataflow.graph import PipelineGraph, collecting
    from airflow_provider_checkpoint.storage import JobStorage
    from airflow_provider_checkpoint.testing.inprocess import Job
    from tests.servers.s3 import ThrottlingProxy, start_server

    small = DataSpec("large-state", spec.increments, spec.events, users, spec.pages, spec.seed)
    directory = Path(tempfile.mkdtemp(prefix="state-io-s3-", dir=work))
    process, server = start_server(directory)
    proxy = ThrottlingProxy(server)
    saved = {k: os.environ.get(k) for k in server.env()}
    os.environ.update({**server.env(), "AWS_ENDPOINT_URL": proxy.endpoint})
    try:
        direct = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False, **server.storage_options())
        landing, table = server.url("bench/landing"), server.url("bench/table")
        with collecting() as nodes:
            totals = KeyedAggregate("totals", FileSource("events", landing, "json", SCHEMA), ["user"], AGGS)
            ParquetTableSink("table", totals, table, "upsert", ["user"], buckets=16)
        graph = PipelineGraph(nodes)
        storage = JobStorage.for_job(server.url("bench/checkpoints"), "state-io")
        coordinator = CheckpointCoordinator(storage, graph, CheckpointSettings(retained_checkpoints=3), None, None)
        job = Job(spark, directory, graph, storage, coordinator)
        landed, per_checkpoint = [], []
        for i in range(1, small.increments + 1):
            events = small.increment(i)
            landed.append(events)
            direct.pipe_file(f"{landing.removeprefix('s3://')}/inc-{i:03d}.json", events_json(events))
            proxy.kinds.clear()
            started = time.perf_counter()
            job.checkpoint()
            counts = {k: proxy.kinds.get(k, 0) for k in KINDS}
            per_checkpoint.append({"checkpoint": i, "events": len(events), "seconds": elapsed(started), **counts})
            log(f"state-io: S3 checkpoint {i}: {counts}")
        got = ds.dataset(table.removeprefix("s3://"), format="parquet", filesystem=direct).to_table().to_pandas()
        matches = list(got.columns) and normalized(got).equals(ground_truth(pd.concat(landed)))
        problems = [] if matches else [f"S3 table differs from the ground truth ({len(got)} rows)"]
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        proxy.close()
        process.terminate()
        process.wait(timeout=15)
    return {"users": users, "checkpoints": per_checkpoint, "problems": problems}


def events_json(events: pd.DataFrame) -> bytes:
    return events.to_json(orient="records", lines=True).encode()


def render(result: dict[str, Any]) -> str:
    engines, requests = result["engines"], result["requests"]
    hadoop, python = engines["medians"]["hadoop"], engines["medians"]["python"]
    ratio = python / hadoop
    lines = [
        f"### State write: Python file engine vs Spark's writer ({engines['rows']:,} keys, local path)",
        "",
        f"Median of {engines['rounds']} alternating rounds after one warm-up round; the write of a full "
        "version as a checkpoint does it (files, sizes and SHA-256 in the handles).",
        "",
        "| engine | median s | all rounds (s) | files | MB |",
        "|---|---:|---|---:|---:|",
    ]
    for name in ("hadoop", "python"):
        files, size = engines["sizes"][name]
        rounds = ", ".join(f"{t:.2f}" for t in engines["times"][name])
        lines.append(f"| {name} | {engines['medians'][name]:.2f} | {rounds} | {files} | {size / MB:.1f} |")
    load = ", ".join(f"{x:.1f}" for x in result["load"])
    lines += ["", f"Python / Spark: {verdict(ratio, 1.3)}.", ""]
    lines += [f"Load average before and after the run (2 cores, shared with other jobs): {load}.", ""]
    lines += [
        f"### S3 requests per checkpoint ({requests['users']:,} keys, FileSource → KeyedAggregate → "
        "ParquetTableSink upsert, all on SeaweedFS)",
        "",
        "| checkpoint | events | s | " + " | ".join(KINDS) + " | total |",
        "|---:|---:|---:|" + "---:|" * (len(KINDS) + 1),
    ]
    for row in requests["checkpoints"]:
        counts = [row[k] for k in KINDS]
        lines.append(
            f"| {row['checkpoint']} | {row['events']:,} | {row['seconds']:.1f} | "
            + " | ".join(str(c) for c in counts)
            + f" | {sum(counts)} |"
        )
    return "\n".join(lines)
