"""Where one checkpoint's time goes: phases and nodes, Spark jobs, driver-side work, storage calls.

Recorded around one checkpoint of our side: the step runner's per-node log lines, every Spark
job the checkpoint ran (from the JVM's status store: wall time, tasks, call site), and a
``cProfile`` of the driver's Python, whose exclusive times are summed by where they are spent
(waiting on the JVM, pyarrow, the filesystem, documents and hashing, the rest). The profiler
adds a little to the profiled checkpoint's own time.
"""

from __future__ import annotations

import cProfile
import logging
import pstats
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from bench.measure import spark_jobs

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_PHASE = re.compile(r"^(\w+) (\S+): (.*) in ([\d.]+)s$")
CATEGORIES = (  # (category, substrings of a function's file or name), first match wins
    ("waiting on the JVM (py4j)", ("py4j/", "socket.py", "recv_into", "sendall")),
    ("pyarrow (read, merge, write Parquet)", ("pyarrow/", "pyarrow.")),
    ("filesystem calls (fsspec, os)", ("fsspec/", "posixpath", "genericpath", "shutil", "{built-in method posix.")),
    ("documents and hashing (json, sha256)", ("json/", "_hashlib", "hashlib", "core/documents", "core/metadata")),
    ("PySpark's Python side", ("pyspark/",)),
    ("this provider's Python", ("airflow_provider_checkpoint/",)),
)
_FS_CALLS = {"info", "exists", "isdir", "isfile", "ls", "glob", "find", "walk", "open", "cat_file", "pipe_file"}
_FS_CALLS |= {"rm", "rm_file", "mv", "makedirs", "size", "put_file", "touch", "link", "cp_file", "delete"}
"""fsspec filesystem operations (each a round trip on an object store), counted where code outside fsspec calls them."""


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextmanager
def recorded(spark: SparkSession) -> Iterator[dict[str, Any]]:
    """Record what runs inside the block; the box holds the breakdown once the block ends."""
    box: dict[str, Any] = {}
    runner = logging.getLogger("airflow_provider_checkpoint.spark.runner")
    handler, level = _Lines(), runner.level
    runner.addHandler(handler)
    runner.setLevel(logging.INFO)
    first_job, gc_before = spark_jobs(spark), _gc_seconds(spark)
    profile = cProfile.Profile()
    profile.enable()
    try:
        yield box
    finally:
        profile.disable()
        runner.removeHandler(handler)
        runner.setLevel(level)
    box.update(
        nodes=[_node(line) for line in handler.lines if _PHASE.match(line)],
        jobs=_jobs(spark, first_job),
        driver=_driver(pstats.Stats(profile)),
        gc_seconds=round(_gc_seconds(spark) - gc_before, 2),
    )


def _gc_seconds(spark: SparkSession) -> float:
    """The JVM's garbage collections so far, in seconds (driver and, in ``local`` mode, executors)."""
    beans = spark._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()  # type: ignore[union-attr]
    return sum(max(int(bean.getCollectionTime()), 0) for bean in beans) / 1000


def _node(line: str) -> dict[str, Any]:
    kind, uid, figures, seconds = _PHASE.match(line).groups()  # type: ignore[union-attr]
    return {"kind": kind, "uid": uid, "seconds": float(seconds), "figures": figures}


def _jobs(spark: SparkSession, first: int) -> list[dict[str, Any]]:
    """Every Spark job since job id ``first``: id, wall seconds, tasks, call site."""
    store = spark.sparkContext._jsc.sc().statusStore()  # type: ignore[union-attr]
    listed = store.jobsList(None)
    jobs = []
    for i in range(listed.size()):
        job = listed.apply(i)
        if job.jobId() < first:
            continue
        start = job.submissionTime().get().getTime()
        end = job.completionTime().get().getTime() if job.completionTime().isDefined() else start
        site = re.sub(r" at .*/(airflow_provider_checkpoint|pyspark)/", r" at \1/", str(job.name()))
        jobs.append({"id": job.jobId(), "seconds": (end - start) / 1000, "tasks": job.numTasks(), "site": site})
    return sorted(jobs, key=lambda j: j["id"])


def _driver(stats: pstats.Stats) -> dict[str, Any]:
    """Exclusive driver time by category, and the number of filesystem calls."""
    seconds = {name: 0.0 for name, _ in CATEGORIES} | {"other Python": 0.0}
    fs_calls = 0
    for (file, _, name), (_, _, own, _, callers) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{file} {name}"
        category = next((c for c, marks in CATEGORIES if any(m in where for m in marks)), "other Python")
        seconds[category] += own
        if "fsspec/" in file and name in _FS_CALLS:
            fs_calls += sum(c[1] for (caller, _, _), c in callers.items() if "fsspec/" not in caller)
    return {"seconds": {k: round(v, 3) for k, v in seconds.items()}, "fs_calls": fs_calls}


def render(breakdown: dict[str, Any], increment: int, wall: dict[str, float]) -> str:
    """The breakdown as Markdown (``wall``: the checkpoint's trigger, step and finalize seconds)."""
    jobs = breakdown["jobs"]
    lines = [
        f"**Where a checkpoint's time goes** (increment {increment}, profiled: "
        f"{sum(wall.values()):.2f}s = trigger {wall['trigger']:.2f}s + step {wall['step']:.2f}s "
        f"+ finalize {wall['finalize']:.2f}s)",
        "",
        "| step node | s | what it did |",
        "|:--|---:|:--|",
        *(f"| {n['kind']} `{n['uid']}` | {n['seconds']:.2f} | {n['figures']} |" for n in breakdown["nodes"]),
        "",
        f"Spark jobs: **{len(jobs)}**, {sum(j['seconds'] for j in jobs):.2f}s in all",
        "",
        "| job | s | tasks | call site |",
        "|---:|---:|---:|:--|",
        *(f"| {j['id']} | {j['seconds']:.2f} | {j['tasks']} | `{j['site']}` |" for j in jobs),
        "",
        f"Driver time by where it is spent (exclusive, whole checkpoint; "
        f"{breakdown['driver']['fs_calls']} filesystem calls):",
        "",
        "| where | s |",
        "|:--|---:|",
        *(f"| {k} | {v:.2f} |" for k, v in breakdown["driver"]["seconds"].items()),
    ]
    return "\n".join(lines)
