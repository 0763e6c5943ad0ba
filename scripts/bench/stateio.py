"""State I/O: the Python file engine vs Spark's own Parquet writer, and S3 requests per checkpoint.

**Engines** (local path, one run): the large-state workload's state after its first increment
(one row per key, ``users`` keys) is written as a full version, as a checkpoint writes it
(:func:`~airflow_provider_checkpoint.state.spark_backend.write_full_version`: one file per key-group
range, each file's size and SHA-256 in its handle), by each engine in turn, ``rounds`` times,
alternating which goes first. Every output is read back with pyarrow and compared with the
pandas ground truth, and every handle is verified against its file.

**Requests** (the S3 server of ``tests/servers``, SeaweedFS): FileSource → KeyedAggregate →
ParquetTableSink (upsert, 16 buckets) with landing area, table and storage root on S3 runs
checkpoint after checkpoint in-process (:mod:`airflow_provider_checkpoint.testing.inprocess`;
the Python engine, as the session has no S3 Hadoop filesystem), ``retained_checkpoints=3``,
in two shapes: the large-state workload (``users`` keys, a few checkpoints of many events) and
the long-run one (20,000 keys, many checkpoints of 200 events). Every request of the driver
and the executors passes a counting proxy; landing the input does not. Each table is checked
against a pandas ground truth at the end, and the requests per checkpoint must not grow with
the job's age.
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


FLAT = 1.1
"""Peak requests per checkpoint late in a run over early (once retention is full): at most this."""


def run(spec: DataSpec, rounds: int, long_run: DataSpec, work: Path) -> dict[str, Any]:
    """``spec``: the engines' state (``users`` keys) and the large-state S3 run; ``long_run``: the long S3 run."""
    load = [os.getloadavg()[0]]
    (work / "run").mkdir(parents=True, exist_ok=True)
    spark, _ = start_spark()
    engines = engines_side_by_side(spark, spec, rounds, work)
    requests = [requests_per_checkpoint(spark, shape, work) for shape in (spec, long_run)]
    problems = engines["problems"] + [p for r in requests for p in r["problems"]]
    return {"engines": engines, "requests": requests, "problems": problems, "load": [*load, os.getloadavg()[0]]}


def engines_side_by_side(spark: Any, spec: DataSpec, rounds: int, work: Path) -> dict[str, Any]:
    import pyarrow.parquet as pq

    from airflow_provider_checkpoint.fileio.writes import ENGINE_CONF
    from airflow_provider_checkpoint.state.spark_backend import write_full_version
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


def requests_per_checkpoint(spark: Any, spec: DataSpec, work: Path) -> dict[str, Any]:
    import pyarrow.dataset as ds
    import s3fs

    sys.path.insert(0, str(REPO))
    from airflow_provider_checkpoint.coordinator import CheckpointCoordinator
    from airflow_provider_checkpoint.core.settings import CheckpointSettings
    from airflow_provider_checkpoint.dataflow import FileSource, KeyedAggregate, ParquetTableSink
    from airflow_provider_checkpoint.dataflow.graph import collecting
    from airflow_provider_checkpoint.dataflow.planner import PipelineGraph
    from airflow_provider_checkpoint.storage import JobStorage
    from airflow_provider_checkpoint.testing.inprocess import Job
    from tests.servers.s3 import ThrottlingProxy, start_server

    directory = Path(tempfile.mkdtemp(prefix="state-io-s3-", dir=work))
    process, server = start_server(directory)
    proxy = ThrottlingProxy(server)
    saved = {k: os.environ.get(k) for k in server.env()}
    os.environ.update({**server.env(), "AWS_ENDPOINT_URL": proxy.endpoint})
    s3fs.S3FileSystem.clear_instance_cache()  # a client made for an earlier run's server keeps its endpoint
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
        for i in range(1, spec.increments + 1):
            events = spec.increment(i)
            landed.append(events)
            direct.pipe_file(f"{landing.removeprefix('s3://')}/inc-{i:03d}.json", events_json(events))
            proxy.kinds.clear()
            started = time.perf_counter()
            job.checkpoint()
            counts = {k: proxy.kinds.get(k, 0) for k in KINDS}
            per_checkpoint.append({"checkpoint": i, "events": len(events), "seconds": elapsed(started), **counts})
            log(f"state-io: S3 {spec.users:,} keys, checkpoint {i}: {counts}")
        got = ds.dataset(table.removeprefix("s3://"), format="parquet", filesystem=direct).to_table().to_pandas()
        matches = list(got.columns) and normalized(got).equals(ground_truth(pd.concat(landed)))
        problems = [] if matches else [f"S3 table differs from the ground truth ({len(got)} rows)"]
        growth = age_growth(per_checkpoint)
        if growth is not None and growth > FLAT:
            problems.append(f"S3 requests per checkpoint grew {growth:.2f}x with the job's age ({spec.users:,} keys)")
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        proxy.close()
        process.terminate()
        process.wait(timeout=15)
    return {"users": spec.users, "checkpoints": per_checkpoint, "growth": growth, "problems": problems}


def age_growth(per_checkpoint: list[dict[str, Any]], filled: int = 5) -> float | None:
    """Peak requests per checkpoint in the second half of the checkpoints from ``filled`` on (retention full)
    over the first half's peak; ``None`` when fewer than four such checkpoints ran. Incremental state makes a
    sawtooth (kept deltas add requests until their range is compacted), so peaks, not single checkpoints."""
    totals = [sum(row[k] for k in KINDS) for row in per_checkpoint[filled - 1 :]]
    if len(totals) < 4:
        return None
    half = len(totals) // 2
    return max(totals[half:]) / max(totals[:half])


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
    for requests in result["requests"]:
        lines += requests_table(requests)
    return "\n".join(lines)


def requests_table(requests: dict[str, Any]) -> list[str]:
    rows = requests["checkpoints"]
    growth = requests["growth"]
    lines = [
        f"### S3 requests per checkpoint ({requests['users']:,} keys, {len(rows)} checkpoints)",
        "",
        "Growth with the job's age (peak requests per checkpoint in the second half of checkpoints 5 onwards "
        "over the first half's): "
        + (verdict(growth, FLAT) if growth is not None else "too few checkpoints to tell")
        + ".",
        "",
        "| checkpoint | events | s | " + " | ".join(KINDS) + " | total |",
        "|---:|---:|---:|" + "---:|" * (len(KINDS) + 1),
    ]
    for row in rows:
        counts = [row[k] for k in KINDS]
        lines.append(
            f"| {row['checkpoint']} | {row['events']:,} | {row['seconds']:.1f} | "
            + " | ".join(str(c) for c in counts)
            + f" | {sum(counts)} |"
        )
    return [*lines, ""]
