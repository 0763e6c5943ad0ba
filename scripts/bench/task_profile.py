"""Where a task process's seconds go, for the benchmarks' DAG files: ``BENCH_TASK_PROFILE=<dir>`` makes each
process that parses the DAG file record every garbage collection (generation, seconds, objects it tracked,
from ``gc.callbacks``) and, with ``BENCH_TASK_CPROFILE=1``, a cProfile, written to ``<dir>/<pid>.json`` /
``<pid>.prof`` when the process exits (the task runner's forked child runs the ``atexit`` hooks it
registered)."""

from __future__ import annotations

import atexit
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def install(directory: str) -> None:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    events: list[dict[str, Any]] = []
    started: list[float] = [0.0]
    origin = time.perf_counter()

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            now = time.perf_counter()
            seconds = now - started[0]
            at = time.time() - seconds  # wall clock, to set beside the task log's timestamps
            events.append({"gen": info["generation"], "s": seconds, "at": at, "collected": info["collected"]})

    gc.callbacks.append(on_gc)
    profile = None
    if os.environ.get("BENCH_TASK_CPROFILE"):
        import cProfile

        profile = cProfile.Profile()
        profile.enable()

    def dump() -> None:
        pid = os.getpid()
        if profile is not None:
            profile.disable()
            profile.dump_stats(out / f"{pid}.prof")
        totals = {g: sum(e["s"] for e in events if e["gen"] == g) for g in (0, 1, 2)}
        counts = {g: sum(1 for e in events if e["gen"] == g) for g in (0, 1, 2)}
        (out / f"{pid}.json").write_text(
            json.dumps(
                {
                    "argv": sys.argv,
                    "title": _title(),
                    "seconds": time.perf_counter() - origin,
                    "gc_seconds": totals,
                    "gc_counts": counts,
                    "frozen": gc.get_freeze_count(),
                    "tracked": len(gc.get_objects()),
                    "threshold": gc.get_threshold(),
                    "events": events,
                }
            )
        )

    atexit.register(dump)


def _title() -> str:
    try:
        return Path(f"/proc/{os.getpid()}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
