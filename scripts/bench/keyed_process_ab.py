"""``KeyedProcess`` with pandas rows against Arrow rows, side by side in one process.

    .venv/bin/python scripts/bench/keyed_process_ab.py --increments 4 --events 100000 --users 100000

The windows mode's stream (bench.windows: clicks with disorder and late rows) through two fresh jobs
alternating per increment: FileSource → KeyedProcess → ParquetTableSink append, trigger → step →
finalize in process. The function keeps a running count and the newest event time per user in value
state, registers an event-time timer 30 minutes after the newest event and emits one row per key and
checkpoint plus one per timer fired; one side's class takes its rows as a pandas DataFrame, the other
(``rows_format = "arrow"``) as a pyarrow Table. Prints each checkpoint's seconds, the medians after the
first and the ratio; both final tables must be equal, and every user's last count must equal its number
of rows by pandas.
"""

from __future__ import annotations

import argparse
import datetime
import shutil
import sys
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pandas as pd  # noqa: E402

from airflow_provider_checkpoint import KeyedProcessFunction, ValueState  # noqa: E402
from bench import windows  # noqa: E402
from bench.inprocess import run_round, start_run  # noqa: E402
from bench.sides import Ours  # noqa: E402
from bench.workloads import land, read_parquet_dir  # noqa: E402

SILENCE = datetime.timedelta(minutes=30)


class Counts(KeyedProcessFunction):
    """Per user: the running count, emitted once per checkpoint with rows, and a row when silent."""

    output_schema = "what STRING, user STRING, n LONG, at TIMESTAMP"
    states = (ValueState("n", "long"), ValueState("newest", "timestamp"))

    def newest(self, rows: Any) -> datetime.datetime:
        return rows["ts"].max().to_pydatetime()

    def process(self, key: Any, rows: Any, ctx: Any) -> Any:
        n, newest = ctx.state("n"), ctx.state("newest")
        n.update((n.get() or 0) + len(rows))
        latest = self.newest(rows)
        if newest.exists():
            if latest <= newest.get():
                return [("count", key[0], n.get(), newest.get())]
            ctx.delete_event_time_timer(newest.get() + SILENCE)
        newest.update(latest)
        ctx.register_event_time_timer(latest + SILENCE)
        return [("count", key[0], n.get(), latest)]

    def on_timer(self, key: Any, timer: Any, ctx: Any) -> Any:
        return [("silent", key[0], ctx.state("n").get(), timer.time)]


class ArrowCounts(Counts):
    rows_format = "arrow"

    def newest(self, rows: Any) -> datetime.datetime:
        import pyarrow.compute as pc

        return pc.max(rows["ts"]).as_py()


class OursKeyedProcess(Ours):
    def __init__(self, spark: Any, root: Path, landing: Path, function: Counts) -> None:
        self.function = function
        super().__init__(spark, root, landing)
        self.name = f"ours-{function.rows_format}"

    def nodes(self, landing: Path, clean_source: str, archive: str | None) -> list[Any]:
        from airflow_provider_checkpoint.dataflow import FileSource, KeyedProcess, ParquetTableSink

        source = FileSource("events", str(landing), "parquet", windows.SCHEMA)
        counts = KeyedProcess("counts", source, ["user"], self.function, watermark=("ts", "10 minutes"))
        return [source, counts, ParquetTableSink("counts_table", counts, str(self.table), mode="append")]

    def output(self) -> pd.DataFrame:
        got = read_parquet_dir(self.table)
        return got[["what", "user", "n", "at"]].sort_values(["what", "user", "n", "at"]).reset_index(drop=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--increments", type=int, default=4)
    parser.add_argument("--events", type=int, default=100_000, help="events per checkpoint")
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--work", type=Path, default=Path("/tmp/checkpoint-bench/keyed-process-ab"))
    args = parser.parse_args()
    spec = windows.WindowSpec(args.increments, args.events, args.users, 42)
    shutil.rmtree(args.work / "run", ignore_errors=True)
    files, frames = windows.generate(args.work / "data", spec)
    run = start_run(args.work / "run")
    landing = args.work / "run" / "landing"
    landing.mkdir(parents=True)
    sides = [
        OursKeyedProcess(run.spark, args.work / "run" / f.rows_format, landing, f) for f in (Counts(), ArrowCounts())
    ]
    seconds: dict[str, list[float]] = {s.name: [] for s in sides}
    for i, data_file in enumerate(files, start=1):
        land(data_file, landing)
        results = run_round(sides, i, run.spark)  # type: ignore[arg-type]
        for side in sides:
            seconds[side.name].append(results[side.name].seconds)
        print(f"checkpoint {i}: " + " | ".join(f"{n} {r.seconds:.2f}s" for n, r in results.items()), flush=True)
    pandas_side, arrow_side = (side.output() for side in sides)
    pd.testing.assert_frame_equal(pandas_side, arrow_side)
    counts = pandas_side[pandas_side["what"] == "count"].groupby("user")["n"].max()
    truth = pd.concat(frames)["user"].value_counts()
    pd.testing.assert_series_equal(counts.sort_index(), truth.sort_index(), check_names=False)
    medians = {name: median(times[1:] or times) for name, times in seconds.items()}
    print(
        "medians after the first checkpoint: "
        + ", ".join(f"{name} {m:.2f}s" for name, m in medians.items())
        + f"; arrow/pandas {medians['ours-arrow'] / medians['ours-pandas']:.2f}; both tables equal, counts equal pandas"
    )


if __name__ == "__main__":
    main()
