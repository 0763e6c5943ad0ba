"""A file source's JSON read alone: Spark's JSON Lines reader against pyarrow.json in the tasks.

    .venv/bin/python scripts/bench/json_read.py --events 1000000 --rounds 5

One JSON Lines file of the large-state workload's first increment (``bench.workloads``), read with the
schema a file source reads it with (the declared columns and ``_corrupt_record``, permissive) and fully
consumed (a count, the malformed count and a hash of every declared column, as the source's observed
pass): by Spark's JSON reader, by ``pyarrow.json`` inside ``mapInArrow`` (two tasks, each a half of the
file cut at a line break, no fall-back: the ceiling of what Arrow could save) and by Spark's text reader
(the lines alone: the floor). Prints wall and CPU seconds (this process tree: the JVM and its Python
workers) per round, then the medians.

Then it shows where ``from_json`` of a line (the Kafka source's fall-back for what Arrow refuses) differs
from the JSON Lines reader's answer for the same line, which is why a file cannot fall back that way.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.workloads import SCHEMA, DataSpec  # noqa: E402

FULL = f"{SCHEMA}, _corrupt_record STRING"
PERMISSIVE = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt_record"}
PROBE = [
    b'{"user":"ok","ts":1}',
    b'{"user":"bad\xff\xfeutf","ts":2}',
    b'\xef\xbb\xbf{"user":"bom","ts":3}',
    b"   ",
    b'{"user":"x","junk":"\xff"}',
]
"""Lines on which the two answers differ (invalid UTF-8, a byte-order mark, a blank line), and one on which
they agree."""


def tree_cpu() -> float:
    """CPU seconds of this process and all its descendants, living ones included."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[tuple[int, float]]] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(
            (int(stat.split("/")[2]), (int(fields[11]) + int(fields[12])) / tick)
        )
    total, todo = sum(os.times()[:2]), [os.getpid()]
    while todo:
        for pid, cpu in children.get(todo.pop(), []):
            total, todo = total + cpu, [*todo, pid]
    return total


def arrow_halves(path: str, size: int, tasks: int) -> Callable[[Iterator[Any]], Iterator[Any]]:
    def scan(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        import pyarrow.json as pj

        declared = pa.schema([("user", pa.string()), ("page", pa.string()), ("ts", pa.int64())])
        out = pa.schema([*declared, ("_corrupt_record", pa.string())])
        for batch in batches:
            for i in batch.column(0).to_pylist():
                with open(path, "rb") as f:
                    data = f.read()
                lo = 0 if i == 0 else data.index(b"\n", size * i // tasks) + 1
                hi = size if i == tasks - 1 else data.index(b"\n", size * (i + 1) // tasks) + 1
                table = pj.read_json(
                    pa.py_buffer(memoryview(data)[lo:hi]),
                    read_options=pj.ReadOptions(use_threads=False, block_size=1 << 20),
                    parse_options=pj.ParseOptions(explicit_schema=declared, unexpected_field_behavior="ignore"),
                )
                for rb in table.to_batches(max_chunksize=65_536):
                    yield pa.RecordBatch.from_arrays([*rb.columns, pa.nulls(rb.num_rows, pa.string())], schema=out)

    return scan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work", type=Path, default=Path("/tmp/json-read-bench"))
    args = parser.parse_args()
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F

    args.work.mkdir(parents=True, exist_ok=True)
    path = str(args.work / "events.json")
    if not Path(path).exists():
        DataSpec("large-state", 1, args.events, args.events, 500, 42).increment(1).to_json(
            path, orient="records", lines=True
        )
    size = os.path.getsize(path)
    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    sides: dict[str, Callable[[], DataFrame]] = {
        "spark json": lambda: spark.read.schema(FULL).options(**PERMISSIVE).json(path),
        "arrow (ceiling)": lambda: spark.range(0, 2, 1, 2).mapInArrow(arrow_halves(path, size, 2), FULL),
        "spark text (floor)": lambda: spark.read.text(path).select(F.length("value").alias("user")),
    }
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
    for n in range(args.rounds + 1):  # round 0 warms up
        for name, frame in sides.items():
            cpu, started = tree_cpu(), time.perf_counter()
            df = frame()
            declared = [c for c in df.columns if c != "_corrupt_record"]
            malformed = F.count("_corrupt_record") if "_corrupt_record" in df.columns else F.lit(0)
            row = df.agg(F.count(F.lit(1)), malformed, F.max(F.hash(*declared))).first()
            wall, used = time.perf_counter() - started, tree_cpu() - cpu
            print(f"round {n} {name}: {wall:.2f}s wall, {used:.2f}s CPU, {tuple(row or ())}", flush=True)
            if n:
                figures[name].append((wall, used))
    for name, runs in figures.items():
        wall, used = median(w for w, _ in runs), median(c for _, c in runs)
        print(f"median {name}: {wall:.2f}s wall, {used:.2f}s CPU ({used / args.events * 1e6:.2f} µs CPU a record)")
    probe = str(args.work / "probe")
    Path(probe).mkdir(exist_ok=True)
    Path(probe, "lines.json").write_bytes(b"\n".join(PROBE) + b"\n")
    lines = spark.read.schema(FULL).options(**PERMISSIVE).json(probe).collect()
    parsed = spark.read.text(probe).select(F.from_json("value", FULL, PERMISSIVE).alias("j")).select("j.*").collect()
    print("JSON Lines reader:", *lines, sep="\n  ")
    print("from_json of each line:", *parsed, sep="\n  ")


if __name__ == "__main__":
    main()
