"""State I/O: the Python file engine vs Spark's own Parquet writer, and S3 requests per checkpoint.

**Engines** (local path, one run): the large-state workload's state after its first increment
(one row per key, ``users`` keys) is written as a full version, as a checkpoint writes it
(:func:`~airflow_provider_checkpoint.state.spark_backend.write_full_version`: one file per key-group
range, each file's size and SHA-256 in its handle), by each engine in turn, ``rounds`` times,
alternating which goes first. Every output is read back with pyarrow and compared with the
pandas ground truth, and every handle is verified against its file.

**Requests** (:mod:`bench.objectstore`): S3 requests per checkpoint by kind, for a small pipeline
and one with every sink kind, and the small pipeline's time on S3 against local disk, over
``long_run.increments`` checkpoints, each in a fresh process.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

import pandas as pd

from bench import objectstore
from bench.inprocess import start_spark
from bench.measure import MB, elapsed, log
from bench.report import verdict
from bench.workloads import DataSpec, ground_truth, normalized

REPO = Path(__file__).resolve().parents[2]


def run(spec: DataSpec, rounds: int, long_run: DataSpec, work: Path) -> dict[str, Any]:
    """``spec``: the engines' state (``users`` keys) and the large-state S3 run; ``long_run``: the long S3 run."""
    load = [os.getloadavg()[0]]
    (work / "run").mkdir(parents=True, exist_ok=True)
    spark, _ = start_spark()
    engines = engines_side_by_side(spark, spec, rounds, work)
    spark.stop()
    requests = objectstore.run(long_run, work)
    problems = engines["problems"] + requests["problems"]
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


def render(result: dict[str, Any]) -> str:
    engines = result["engines"]
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
    return "\n".join(lines) + objectstore.render(result["requests"])
