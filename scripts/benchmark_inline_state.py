"""Small-state pipeline: state in files vs inline (memory checkpoint storage), side by side in one run.

Two jobs over the same input, one SparkSession, checkpoints alternating between them
(the order swaps every round): ``files`` keeps every operator's state in Parquet files
(``inline_state_threshold=0``), ``inline`` keeps it in the acks and ``_metadata``
(``checkpoint_storage="memory"``). Reports per checkpoint the files written in the job
directory, the ``_metadata`` size, and the seconds of trigger, steps and finalize.

    .venv/bin/python scripts/benchmark_inline_state.py --increments 8 --events 2000
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
from pathlib import Path

from airflow_provider_checkpoint.dataflow import FileSource, KeyedAggregate, ParquetTableSink
from airflow_provider_checkpoint.spark.session import get_spark
from airflow_provider_checkpoint.testing.inprocess import Job, make_job

SETTINGS = {
    "files": {"inline_state_threshold": 0},
    "inline": {"checkpoint_storage": "memory"},
}


def pipeline(tmp: Path) -> None:
    events = FileSource("events", str(tmp / "landing"), "json", "user STRING, page STRING, ts LONG")
    users = KeyedAggregate("users", events, ["user"], {"events": "count", "last": "max(ts)"})
    pages = KeyedAggregate("pages", events, ["page"], {"views": "count"})
    ParquetTableSink("users_table", users, str(tmp / "marts" / "users"), "upsert", ["user"], step="main")
    ParquetTableSink("pages_table", pages, str(tmp / "marts" / "pages"), "upsert", ["page"], step="main")


def land(landings: list[Path], n: int, events: int) -> None:
    rng = random.Random(n)
    rows = [
        {"user": f"u{rng.randrange(200)}", "page": f"/p{rng.randrange(20)}", "ts": n * 10**6 + i} for i in range(events)
    ]
    for landing in landings:
        landing.mkdir(parents=True, exist_ok=True)
        (landing / f".e{n}").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (landing / f".e{n}").rename(landing / f"e{n}.json")


def measure(job: Job, checkpoint_id: int) -> dict[str, float]:
    chk = job.tmp / "ckpt" / "multi" / f"chk-{checkpoint_id}"
    files = [p for p in chk.rglob("*") if p.is_file() and p.name not in ("_metadata", "_plan.json")]
    return {**job.timings[-1], "files": len(files), "metadata_bytes": (chk / "_metadata").stat().st_size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--increments", type=int, default=8)
    parser.add_argument("--events", type=int, default=2000)
    args = parser.parse_args()
    spark = get_spark(master="local[2]")
    root = Path(tempfile.mkdtemp(prefix="bench-inline-"))
    jobs = {name: make_job(spark, root / name, pipeline, **settings) for name, settings in SETTINGS.items()}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in jobs}
    for n in range(1, args.increments + 1):
        land([root / name / "landing" for name in jobs], n, args.events)
        for name in sorted(jobs, reverse=n % 2 == 0):
            jobs[name].checkpoint()
            results[name].append(measure(jobs[name], n))
    print(f"{args.increments} checkpoints of {args.events} events, 200 + 20 keys of state (medians)")
    print(f"{'':8} {'files':>6} {'_metadata B':>12} {'trigger s':>10} {'steps s':>8} {'finalize s':>11}")
    medians = {}
    for name, rows in results.items():
        medians[name] = {k: statistics.median(r[k] for r in rows[1:]) for k in rows[0]}  # first: warm-up
        m = medians[name]
        print(
            f"{name:8} {m['files']:6.0f} {m['metadata_bytes']:12.0f} "
            f"{m['trigger']:10.3f} {m['steps']:8.2f} {m['finalize']:11.3f}"
        )
    f, i = medians["files"], medians["inline"]
    print(f"inline/files: steps {i['steps'] / f['steps']:.2f}x, finalize {i['finalize'] / f['finalize']:.2f}x")


if __name__ == "__main__":
    main()
