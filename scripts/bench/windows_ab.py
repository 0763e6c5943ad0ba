"""Windows merged by Spark or on the driver, side by side with Structured Streaming, in one process.

    .venv/bin/python scripts/bench/windows_ab.py tumbling --increments 4 --events 100000

The windows mode's stream (bench.windows) through three sides alternating per increment: ours with
``driver_merge_rows=0`` (every checkpoint merges the open windows in Spark jobs), ours with the default
(tumbling and sliding windows merge on the driver), and Structured Streaming (RocksDB, changelog
checkpointing). Prints each checkpoint's seconds and state, the medians after the first checkpoint and
the ratios to SS; every side's final table is checked against the pandas truth.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pandas as pd  # noqa: E402

from bench import windows  # noqa: E402
from bench.inprocess import run_round, start_run  # noqa: E402
from bench.workloads import land  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shape", choices=windows.SHAPES)
    parser.add_argument("--increments", type=int, default=4)
    parser.add_argument("--events", type=int, default=100_000, help="events per checkpoint (and users)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/checkpoint-bench/windows-ab"))
    args = parser.parse_args()
    spec = windows.WindowSpec(args.increments, args.events, args.events, 42)
    shutil.rmtree(args.work / "run", ignore_errors=True)
    files, frames = windows.generate(args.work / "data", spec)
    run = start_run(args.work / "run")
    landing = args.work / "run" / "landing"
    landing.mkdir(parents=True)
    on_spark = windows.OursWindows(run.spark, args.work / "run" / "spark", landing, args.shape)
    on_spark.name = "ours-spark-merge"
    on_spark.coordinator.settings = dataclasses.replace(on_spark.coordinator.settings, driver_merge_rows=0)
    on_driver = windows.OursWindows(run.spark, args.work / "run" / "driver", landing, args.shape)
    on_driver.name = "ours-driver-merge"
    ss = windows.StreamingWindows(run.spark, args.work / "run" / "ss", landing, args.shape)
    sides = [on_spark, on_driver, ss]
    seconds: dict[str, list[float]] = {s.name: [] for s in sides}
    for i, data_file in enumerate(files, start=1):
        land(data_file, landing)
        results = run_round(sides, i, run.spark)
        cells = []
        for side in sides:
            seconds[side.name].append(results[side.name].seconds)
            cells.append(f"{side.name} {results[side.name].seconds:.2f}s, state {side.state_bytes() / 1e6:.1f} MB")
        print(f"checkpoint {i}: " + " | ".join(cells), flush=True)
    expected = windows.truth(frames, args.shape)
    for side in sides:
        pd.testing.assert_frame_equal(windows.normalized(side.output()), expected)
    medians = {name: median(times[1:] or times) for name, times in seconds.items()}
    print(
        "medians after the first checkpoint: "
        + ", ".join(f"{name} {m:.2f}s" for name, m in medians.items())
        + f"; ratio to SS: Spark merge {medians['ours-spark-merge'] / medians[ss.name]:.2f}, "
        f"driver merge {medians['ours-driver-merge'] / medians[ss.name]:.2f}; final tables equal the pandas truth"
    )


if __name__ == "__main__":
    main()
