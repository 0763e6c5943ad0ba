"""Windows merged by Spark or on the driver, side by side with Structured Streaming, in one process.

    .venv/bin/python scripts/bench/windows_ab.py tumbling --increments 4 --events 100000
    .venv/bin/python scripts/bench/windows_ab.py tumbling --increments 30 --events 1000000 --sides driver ss

The windows mode's stream (bench.windows: a steady stream, each increment the next 5 minutes of event
time) through the chosen sides alternating per increment (default all three): ours with
``driver_merge_rows=0`` (``spark``: every checkpoint merges the open windows in Spark jobs), ours with the
default (``driver``: tumbling and sliding windows merge on the driver), and Structured Streaming (``ss``:
RocksDB, changelog checkpointing). Prints each checkpoint's seconds and state bytes on disk, the medians
after the first checkpoint, the ratios to SS, and how flat each side's state is over the second half of
the run; every side's final table is checked against the pandas truth.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import time
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pandas as pd  # noqa: E402

from bench import windows  # noqa: E402
from bench.inprocess import run_round, start_run  # noqa: E402
from bench.workloads import land  # noqa: E402

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SIDES = ("spark", "driver", "ss")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shape", choices=windows.SHAPES)
    parser.add_argument("--increments", type=int, default=4)
    parser.add_argument("--events", type=int, default=100_000, help="events per checkpoint")
    parser.add_argument("--users", type=int, default=None, help="distinct users (default: --events)")
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--work", type=Path, default=Path("/tmp/checkpoint-bench/windows-ab"))
    args = parser.parse_args()
    spec = windows.WindowSpec(args.increments, args.events, args.users or args.events, 42)
    shutil.rmtree(args.work / "run", ignore_errors=True)
    started = time.perf_counter()
    files, frames = windows.generate(args.work / "data", spec)
    print(f"input: {args.increments} increments of {args.events:,} events in {time.perf_counter() - started:.1f}s")
    run = start_run(args.work / "run")
    landing = args.work / "run" / "landing"
    landing.mkdir(parents=True)
    sides = [
        make_side(name, run.spark, args.work / "run" / name, landing, args.shape)
        for name in SIDES
        if name in args.sides
    ]
    seconds: dict[str, list[float]] = {s.name: [] for s in sides}
    state: dict[str, list[int]] = {s.name: [] for s in sides}
    for i, data_file in enumerate(files, start=1):
        land(data_file, landing)
        results = run_round(sides, i, run.spark)
        cells = []
        for side in sides:
            seconds[side.name].append(results[side.name].seconds)
            state[side.name].append(side.state_bytes())
            cells.append(f"{side.name} {results[side.name].seconds:.2f}s, state {state[side.name][-1]:,} B")
        print(f"checkpoint {i} (load {os.getloadavg()[0]:.1f}): " + " | ".join(cells), flush=True)
    expected = windows.truth(frames, args.shape)
    for side in sides:
        pd.testing.assert_frame_equal(windows.normalized(side.output()), expected)
    medians = {name: median(times[1:] or times) for name, times in seconds.items()}
    ss = medians.get(f"ss-{args.shape}")
    ours = [(name, m) for name, m in medians.items() if name.startswith("ours")]
    ratios = "" if ss is None else "; time ratio to SS: " + ", ".join(f"{n} {m / ss:.2f}" for n, m in ours)
    print("medians after the first checkpoint: " + ", ".join(f"{n} {m:.2f}s" for n, m in medians.items()) + ratios)
    for name, sizes in state.items():
        print(f"{name} state: {flatness(sizes)}")
    print(f"final tables equal the pandas truth ({len(expected):,} final windows)")


def make_side(name: str, spark: SparkSession, root: Path, landing: Path, shape: str) -> Any:
    """The side ``name`` of :data:`SIDES`."""
    if name == "ss":
        return windows.StreamingWindows(spark, root, landing, shape)
    ours = windows.OursWindows(spark, root, landing, shape)
    ours.name = f"ours-{name}-merge"
    if name == "spark":
        ours.coordinator.settings = dataclasses.replace(ours.coordinator.settings, driver_merge_rows=0)
    return ours


def flatness(sizes: list[int]) -> str:
    """The state bytes over the second half of the run: least, greatest, and last against the midpoint."""
    half = sizes[len(sizes) // 2 :]
    return (
        f"second half (checkpoints {len(sizes) - len(half) + 1}-{len(sizes)}) {min(half):,}-{max(half):,} B "
        f"(max/min {max(half) / max(min(half), 1):.2f}); last/midpoint {sizes[-1] / max(half[0], 1):.2f}"
    )


if __name__ == "__main__":
    main()
