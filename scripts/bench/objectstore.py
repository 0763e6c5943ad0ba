"""A checkpoint on object storage: S3 requests per checkpoint by kind, and S3 against local disk.

Two pipelines read the large-state workload (increment 1 holds every key, later ones ``events``
events), ``retained_checkpoints=3``, everything (landing area, tables, storage root) on the S3
server of ``tests/servers`` (SeaweedFS) or on local disk:

- **small**: FileSource → KeyedAggregate → ParquetTableSink (upsert, its default 8 buckets) and
  DeltaTableSink (append), on S3 and on local disk;
- **every sink kind**: the same aggregate into ParquetTableSink (append) and DeltaTableSink
  (upsert), on S3 only.

Each checkpoint of each job runs in a fresh Python process with its own SparkSession, as Airflow
runs each task in a fresh process: nothing a process caches carries over from one checkpoint to
the next, and no job finds the JVM warmed up by another. The small pipeline's S3 and local
checkpoints alternate which goes first; the every-kind one runs last. The S3 server logs every
request it answers, whoever sends it (the driver, Spark's Python workers, delta-rs); the requests
are counted by kind from its log per process; landing the input is not counted.
At the end every table is read back with readers we did not write (pyarrow, delta-rs) and
compared with a pandas ground truth.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd

from bench.measure import elapsed, log
from bench.report import verdict
from bench.workloads import AGGS, COLUMNS, SCHEMA, DataSpec, ground_truth, normalized

REPO = Path(__file__).resolve().parents[2]
KINDS = ("LIST", "GET", "HEAD", "PUT", "DELETE", "POST")
PIPELINES = {"small": ("upsert", "append"), "every-kind": ("append", "upsert")}
"""Pipeline: (Parquet sink mode, Delta sink mode)."""
FLAT = 1.1
"""Peak requests per checkpoint late in a run over early (once retention is full): at most this."""
MOST = 100
"""Requests per checkpoint of the small pipeline: at most this."""
S3_OVER_LOCAL = 1.5
RESULT = "objectstore-result: "


def declare(root: str, parquet_mode: str, delta_mode: str) -> None:
    """The pipeline under ``root``: landing area, tables (the checkpoint storage is beside them)."""
    from airflow_provider_checkpoint.dataflow import DeltaTableSink, FileSource, KeyedAggregate, ParquetTableSink

    totals = KeyedAggregate("totals", FileSource("events", f"{root}/landing", "json", SCHEMA), ["user"], AGGS)
    keys = ["user"] if parquet_mode == "upsert" else None
    ParquetTableSink("table", totals, f"{root}/parquet", parquet_mode, keys)
    DeltaTableSink("delta", totals, f"{root}/delta", delta_mode, ["user"] if delta_mode == "upsert" else None)


def worker(spec: dict[str, Any]) -> None:
    """Checkpoint ``spec["checkpoint"]`` of the job ``spec["name"]`` under ``spec["root"]``."""
    sys.path.insert(0, str(REPO))
    from airflow_provider_checkpoint.coordinator import CheckpointCoordinator
    from airflow_provider_checkpoint.core.settings import CheckpointSettings
    from airflow_provider_checkpoint.dataflow.graph import collecting
    from airflow_provider_checkpoint.dataflow.planner import PipelineGraph
    from airflow_provider_checkpoint.storage import JobStorage
    from airflow_provider_checkpoint.testing.inprocess import Job
    from bench.inprocess import start_spark

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")  # the provider's phases
    spark, _ = start_spark()
    name, root = spec["name"], spec["root"]
    with collecting() as nodes:
        declare(root, *PIPELINES[name.split("@")[0]])
    graph = PipelineGraph(nodes)
    storage = JobStorage.for_job(f"{root}/checkpoints", "bench")
    coordinator = CheckpointCoordinator(storage, graph, CheckpointSettings(retained_checkpoints=3), None, None)
    job = Job(spark, Path(spec["tmp"]), graph, storage, coordinator, checkpoints=spec["checkpoint"] - 1)
    started = time.perf_counter()
    job.checkpoint()
    print(RESULT + json.dumps({name: {"seconds": elapsed(started), **job.timings[-1]}}), flush=True)


def run(spec: DataSpec, work: Path, dump: Path | None = None) -> dict[str, Any]:
    """``spec.increments`` checkpoints of each pipeline; see the module's docstring. ``dump``: write each
    checkpoint's requests (kind, path, status) there, a file per pipeline and checkpoint."""
    import s3fs

    sys.path.insert(0, str(REPO))
    from tests.servers.s3 import AccessLog, start_server

    load = [os.getloadavg()[0]]
    directory = Path(tempfile.mkdtemp(prefix="objectstore-", dir=work))
    (directory / "s3").mkdir()
    process, server = start_server(directory / "s3", access_log=True)
    path = [str(REPO), str(REPO / "scripts"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, **server.env(), "PYTHONPATH": os.pathsep.join(path)}
    s3 = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False, **server.storage_options())
    roots = {"small@s3": server.url("small"), "small@local": f"file://{directory}/local/small"}
    roots["every-kind@s3"] = server.url("every-kind")
    access = AccessLog(directory / "s3")
    landed: list[pd.DataFrame] = []
    rows: list[dict[str, Any]] = []
    try:
        for i in range(1, spec.increments + 1):
            events = spec.increment(i)
            landed.append(events)
            for root in roots.values():
                land(s3, root, f"inc-{i:04d}.json", events.to_json(orient="records", lines=True).encode())
            row: dict[str, Any] = {"checkpoint": i, "events": len(events)}
            for name in [*["small@s3", "small@local"][:: 1 if i % 2 else -1], "every-kind@s3"]:
                access.since()
                row.update(checkpoint_in_fresh_process(i, name, roots[name], directory, env))
                if not name.endswith("@s3"):
                    continue
                pipeline, requests = name.removesuffix("@s3"), access.since()
                counts = Counter(r.kind for r in requests)
                row[f"{pipeline} requests"] = {k: counts.get(k, 0) for k in KINDS}
                if dump:
                    text = "\n".join(f"{r.kind} {r.path} {r.status}" for r in requests)
                    (dump / f"{pipeline}-{i:03d}.txt").write_text(text)
            rows.append(row)
            log(f"object-store: checkpoint {i}: {summary(row)}")
        problems = check_tables(s3, server, roots, landed)
    finally:
        process.terminate()
        process.wait(timeout=15)
    load.append(os.getloadavg()[0])
    return {"users": spec.users, "events": spec.events, "rows": rows, "problems": problems, "load": load}


def land(s3: Any, root: str, name: str, data: bytes) -> None:
    """``data`` as ``root/landing/name``, atomically (an S3 PUT; a rename on local disk)."""
    if root.startswith("s3://"):
        s3.pipe_file(f"{root.removeprefix('s3://')}/landing/{name}", data)
        return
    landing = Path(root.removeprefix("file://")) / "landing"
    landing.mkdir(parents=True, exist_ok=True)
    (landing / f".{name}.inflight").write_bytes(data)
    os.rename(landing / f".{name}.inflight", landing / name)


def checkpoint_in_fresh_process(
    checkpoint: int, name: str, root: str, directory: Path, env: dict[str, str]
) -> dict[str, Any]:
    """Run :func:`worker` in a new Python process; the job's timings (its log: ``checkpoint-NNN-<name>.log``)."""
    spec = {"checkpoint": checkpoint, "name": name, "root": root, "tmp": str(directory / "tmp")}
    code = "import json, sys; from bench.objectstore import worker; worker(json.loads(sys.argv[1]))"
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(spec)], env=env, capture_output=True, text=True, check=False
    )
    (directory / f"checkpoint-{checkpoint:03d}-{name}.log").write_text(done.stderr)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode or not lines:
        raise RuntimeError(f"checkpoint {checkpoint} of {name} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return dict(json.loads(lines[-1].removeprefix(RESULT)))


def summary(row: dict[str, Any]) -> str:
    parts = [
        f"{name} {row[name]['seconds']:.1f}s (trigger {row[name]['trigger']:.1f}, steps {row[name]['steps']:.1f}, "
        f"finalize {row[name]['finalize']:.1f})"
        for name in row
        if "@" in name
    ]
    parts += [f"{name} {sum(counts.values())} ({counts})" for name, counts in row.items() if name.endswith("requests")]
    return ", ".join(parts)


def check_tables(s3: Any, server: Any, roots: dict[str, str], landed: list[pd.DataFrame]) -> list[str]:
    """Every table against pandas: an upsert table holds each key's totals once, an append table every
    checkpoint's changed totals (the keys of its increment, totals over all input up to it)."""
    import pyarrow as pa
    import pyarrow.dataset as ds
    from deltalake import DeltaTable

    totals = canonical(ground_truth(pd.concat(landed)))
    appended = canonical(
        pd.concat(
            ground_truth(pd.concat(landed[: i + 1])).merge(events[["user"]].drop_duplicates())
            for i, events in enumerate(landed)
        )
    )
    s3_options = {
        "aws_access_key_id": server.key,
        "aws_secret_access_key": server.secret,
        "aws_endpoint_url": server.endpoint,
        "aws_region": "us-east-1",
        "aws_allow_http": "true",
    }
    problems = []
    for name, root in roots.items():
        parquet_mode, delta_mode = PIPELINES[name.split("@")[0]]
        on_s3 = root.startswith("s3://")
        where = root.removeprefix("s3://") if on_s3 else root.removeprefix("file://")
        parquet = ds.dataset(f"{where}/parquet", format="parquet", filesystem=s3 if on_s3 else None)
        delta = DeltaTable(
            f"{root}/delta" if on_s3 else f"{where}/delta", storage_options=s3_options if on_s3 else None
        )
        for table, mode, got in (
            ("parquet", parquet_mode, parquet.to_table().to_pandas()),
            ("delta", delta_mode, pa.table(delta.scan()).to_pandas()),  # scan() applies deletion vectors
        ):
            if not canonical(got).equals(totals if mode == "upsert" else appended):
                problems.append(f"{name} {table} ({mode}) differs from the ground truth ({len(got)} rows)")
    return problems


def canonical(df: pd.DataFrame) -> pd.DataFrame:
    """Rows in one order, for comparing multisets."""
    return normalized(df).sort_values(COLUMNS).reset_index(drop=True)


def age_growth(totals: list[int], filled: int = 5) -> float | None:
    """Peak requests per checkpoint in the second half of the checkpoints from ``filled`` on (retention full)
    over the first half's peak; ``None`` when fewer than four such checkpoints ran. Incremental state makes a
    sawtooth (kept deltas add requests until their range is compacted), so peaks, not single checkpoints."""
    totals = totals[filled - 1 :]
    if len(totals) < 4:
        return None
    half = len(totals) // 2
    return max(totals[half:]) / max(totals[:half])


def render(result: dict[str, Any]) -> str:
    rows = result["rows"]
    small = [sum(row["small requests"].values()) for row in rows]
    wide = [sum(row["every-kind requests"].values()) for row in rows]
    ratios = [row["small@s3"]["seconds"] / row["small@local"]["seconds"] for row in rows[1:]]
    lines = [
        f"### A checkpoint on S3 ({result['users']:,} keys, {result['events']:,} events a checkpoint, "
        f"{len(rows)} checkpoints)",
        "",
        f"- Requests per checkpoint, small pipeline: at most {max(small)} "
        f"({'met' if max(small) <= MOST else '**not met**'}, target ≤ {MOST}); growth with the job's age "
        "(peak in the second half of checkpoints 5 onwards over the first half's): " + growth_text(small),
        "- Requests per checkpoint, every sink kind: at most " + f"{max(wide)}; growth " + growth_text(wide),
        "- S3 over local disk, small pipeline, median of checkpoints 2 onwards: "
        + (verdict(statistics.median(ratios), S3_OVER_LOCAL) if ratios else "too few checkpoints")
        + ".",
        "",
        f"Load average before and after the run (2 cores, shared with other jobs): "
        f"{', '.join(f'{x:.1f}' for x in result['load'])}.",
        "",
        "| checkpoint | events | local s | S3 s | S3/local | small: " + " | ".join(KINDS[:5]) + " | total "
        "| every kind: total |",
        "|---:|---:|---:|---:|---:|" + "---:|" * 7,
    ]
    for row, total, every in zip(rows, small, wide, strict=True):
        local, s3 = row["small@local"]["seconds"], row["small@s3"]["seconds"]
        counts = " | ".join(str(row["small requests"][k]) for k in KINDS[:5])
        lines.append(
            f"| {row['checkpoint']} | {row['events']:,} | {local:.2f} | {s3:.2f} | {s3 / local:.2f} | {counts} "
            f"| {total} | {every} |"
        )
    return "\n".join([*lines, ""])


def growth_text(totals: list[int]) -> str:
    growth = age_growth(totals)
    return (verdict(growth, FLAT) if growth is not None else "too few checkpoints to tell") + "."
