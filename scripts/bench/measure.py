"""Measurement: net bytes written between two directory listings, wall time, CPU shares."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MB = 1_000_000

Listing = dict[str, tuple[int, int, int]]


def listing(*roots: Path) -> Listing:
    """Every regular file under ``roots``: path → (size, mtime_ns, inode). Symlinks are not followed."""
    out: Listing = {}
    for root in roots:
        for dirpath, _, names in os.walk(root):
            for name in names:
                path = os.path.join(dirpath, name)
                st = os.lstat(path)
                if not os.path.islink(path):
                    out[path] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return out


def written(before: Listing, after: Listing, only: Callable[[str], bool] = lambda p: True) -> tuple[int, int]:
    """(bytes, files) of files that are new or replaced between the two listings.

    Files created and deleted within the interval (temporary files, staging moved by a
    rename is counted once at its final name) are not seen: this is the net output.
    """
    changed = [v for path, v in after.items() if only(path) and before.get(path) != v]
    return sum(v[0] for v in changed), len(changed)


def footprint(before: Listing) -> int:
    return sum(v[0] for v in before.values())


class CpuMeter:
    """CPU used by this process and its descendants (the JVM) vs the whole machine."""

    tick = os.sysconf("SC_CLK_TCK")

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.busy0, self.ours0 = self._busy(), self._ours()

    @staticmethod
    def _busy() -> int:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:9]]
        return sum(values) - values[3] - values[4]  # minus idle and iowait

    @staticmethod
    def _ours() -> int:
        parents: dict[int, int] = {}
        times: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2 :].split()
            parents[int(entry)] = int(fields[1])
            times[int(entry)] = int(fields[11]) + int(fields[12])
        mine = {os.getpid()}
        grew = True
        while grew:
            grew = False
            for pid, ppid in parents.items():
                if ppid in mine and pid not in mine:
                    mine.add(pid)
                    grew = True
        return sum(times.get(pid, 0) for pid in mine)

    def stop(self) -> tuple[float, float]:
        """(cores used by us, cores used by other processes), averaged over the interval."""
        seconds = max(elapsed(self.started), 1e-6)
        busy, ours = self._busy() - self.busy0, self._ours() - self.ours0
        return ours / self.tick / seconds, max(busy - ours, 0) / self.tick / seconds


def elapsed(started: float) -> float:
    return time.perf_counter() - started


def spark_jobs(spark: SparkSession) -> int:
    """Spark jobs submitted so far in this JVM (the DAG scheduler's next job id)."""
    try:
        return int(spark.sparkContext._jsc.sc().dagScheduler().nextJobId())  # type: ignore[union-attr]
    except Exception:
        return -1


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextmanager
def measured(spark: SparkSession, roots: tuple[Path, ...]) -> Iterator[dict[str, Any]]:
    box: dict[str, Any] = {"before": listing(*roots), "jobs": spark_jobs(spark), "cpu": CpuMeter()}
    yield box
    box["cpu"] = box["cpu"].stop()
    box["jobs"] = spark_jobs(spark) - box["jobs"]
    box["after"] = listing(*roots)


def settle(spark: SparkSession) -> None:
    """Between sides: drop cached data and collect garbage in the JVM."""
    spark.catalog.clearCache()
    spark._jvm.System.gc()  # type: ignore[union-attr]
