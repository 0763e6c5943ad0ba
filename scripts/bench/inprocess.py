"""In-process mode: every side runs each increment in one process and one JVM, alternating.

The sides share the SparkSession built by the provider's ``get_spark`` (``local[2]``, the
embedded session's JVM options and configuration), so Structured Streaming gets exactly the
settings our embedded step gets. Outputs are checked against a pandas ground truth.
"""

from __future__ import annotations

import os
import platform
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from bench.measure import CpuMeter, elapsed, log, settle
from bench.sides import STORES, Ours, Side, SideResult, Streaming
from bench.workloads import DataSpec, generate, ground_truth, land, normalized

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def start_spark(conf: dict[str, str] | None = None, input_bytes: int | None = None) -> tuple[SparkSession, float]:
    """The provider's embedded session (same builder and options as a step task, ``conf`` over them;
    the JIT a step reading ``input_bytes`` gets) and its start time."""
    from airflow_provider_checkpoint.spark.session import get_spark

    started = time.perf_counter()
    spark = get_spark(master="local[2]", conf=conf, input_bytes=input_bytes)
    spark.sparkContext.setLogLevel("ERROR")  # SS warns about AQE and state-store loading on every start
    return spark, elapsed(started)


@dataclass
class BenchRun:
    """A benchmark run under way: its session, the machine's facts and what :meth:`finish` reports against."""

    spark: SparkSession
    facts: dict[str, Any]
    load_before: tuple[float, float, float]
    cpu_all: CpuMeter
    started: float

    def finish(self) -> dict[str, Any]:
        """Stop the session; the machine's facts, the load before and after, other processes' cores, the wall time."""
        wall = elapsed(self.started)
        self.spark.stop()
        return {
            "machine": self.facts,
            "load_before": self.load_before,
            "load_after": os.getloadavg(),
            "other_processes_cores": round(self.cpu_all.stop()[1], 2),
            "wall_seconds": round(wall, 1),
        }


def start_run(run_dir: Path, conf: dict[str, str] | None = None, input_bytes: int | None = None) -> BenchRun:
    """Clear ``run_dir``, note the load, start measuring every process's CPU and the wall time, start the session
    (``conf`` over the provider's options, the JIT of a step reading ``input_bytes``)."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    load_before = os.getloadavg()
    cpu_all = CpuMeter()
    started = time.perf_counter()
    spark, session_seconds = start_spark(conf, input_bytes)
    return BenchRun(spark, machine_facts(spark, session_seconds), load_before, cpu_all, started)


def make_sides(
    spark: SparkSession, root: Path, landing: Path, stores: tuple[str, ...] = tuple(STORES), ours: bool = True
) -> list[Side]:
    """Our side first (unless ``ours`` is false), then Structured Streaming on each of ``stores``."""
    mine: list[Side] = [Ours(spark, root / "ours", landing)] if ours else []
    return [*mine, *(Streaming(spark, root / f"ss-{s}", landing, s) for s in stores)]


def run_round(sides: list[Side], i: int, spark: SparkSession) -> dict[str, SideResult]:
    """Run every side on increment ``i``; the order rotates by one per increment."""
    shift = (i - 1) % len(sides)
    results: dict[str, SideResult] = {}
    for side in sides[shift:] + sides[:shift]:
        settle(spark)
        results[side.name] = side.run(i)
    settle(spark)
    return results


def warm_up(
    spark: SparkSession, run_dir: Path, data_file: Path, stores: tuple[str, ...] = tuple(STORES), ours: bool = True
) -> None:
    """One small increment through every side, so none pays the JVM's warm-up in the figures."""
    started = time.perf_counter()
    root = run_dir / "warmup"
    landing = root / "landing"
    landing.mkdir(parents=True)
    with data_file.open() as f:
        (landing / "warmup.json").write_text("".join(line for _, line in zip(range(20_000), f, strict=False)))
    run_round(make_sides(spark, root, landing, stores, ours), 1, spark)
    shutil.rmtree(root)
    log(f"warm-up: {elapsed(started):.1f}s")


def run(spec: DataSpec, work: Path, warmup: bool = True) -> dict[str, Any]:
    """Run the workload; the raw figures (JSON-able), including whether every output was correct."""
    files = generate(work / "data" / spec.workload, spec)
    run_dir = work / "run" / spec.workload
    measured = start_run(run_dir)
    if warmup:
        warm_up(measured.spark, run_dir, files[0])
    job = run_job(measured.spark, spec, files, run_dir, profiled=len(files))
    return {"spec": spec, **measured.finish(), **job}


def run_job(
    spark: SparkSession,
    spec: DataSpec,
    files: list[Path],
    run_dir: Path,
    profiled: int,
    stores: tuple[str, ...] = tuple(STORES),
    rotate: int = 0,
    ours: bool = True,
) -> dict[str, Any]:
    """One fresh job per side over ``files`` (the increments of ``spec``), the sides alternating.

    Our checkpoint of increment ``profiled`` (every one: -1) records where its time goes (:mod:`bench.breakdown`).
    ``rotate`` shifts which side starts each increment (:func:`run_round`); ``ours`` false leaves our side out.
    The figures: per increment every side's result, each side's footprint, and every side whose
    final output differs from the pandas ground truth (``problems``).
    """
    landing = run_dir / "landing"
    landing.mkdir(parents=True)
    sides = make_sides(spark, run_dir, landing, stores, ours)
    seen: set[str] = set()
    frames: list[pd.DataFrame] = []
    rows: list[dict[str, Any]] = []
    for i, data_file in enumerate(files, start=1):
        frame = spec.increment(i)
        frames.append(frame)
        changed = set(frame["user"].unique())
        seen |= changed
        land(data_file, landing)
        sides[0].profile = ours and profiled in (i, -1)  # type: ignore[attr-defined]
        results = run_round(sides, i + rotate, spark)
        wrong = {name: r.records_in for name, r in results.items() if r.records_in != len(frame)}
        if wrong:
            log(f"!! increment {i}: records in {wrong}, expected {len(frame)}")
        rows.append(
            {"increment": i, "events": len(frame), "keys_changed": len(changed), "keys_total": len(seen), **results}
        )
        log(
            f"increment {i}: "
            + " | ".join(f"{n} {r.seconds:.2f}s {r.bytes_chk / 1e6:.2f} MB" for n, r in results.items())
        )
    truth = ground_truth(pd.concat(frames, ignore_index=True))
    problems: dict[str, str] = {}
    for side in sides:
        try:
            pd.testing.assert_frame_equal(normalized(side.output()), truth)
        except AssertionError as e:
            problems[side.name] = str(e)
    return {
        "footprint_bytes": {side.name: side.footprint() for side in sides},
        "truth_rows": len(truth),
        "problems": problems,
        "rows": rows,
    }


def machine_facts(spark: SparkSession, session_seconds: float) -> dict[str, Any]:
    import pyspark

    mem_kb = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": cpu,
        "memory_gib": round(mem_kb / 1024**2, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "java": spark._jvm.System.getProperty("java.version"),  # type: ignore[union-attr]
        "master": spark.sparkContext.master,
        "shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
        "session_start_seconds": round(session_seconds, 1),
    }
