"""Benchmark: this provider's checkpointed pipeline vs Spark Structured Streaming.

Modes (see docs/benchmarks.md):

    .venv/bin/python scripts/benchmark.py clickstream --increments 6 --events 200000
    .venv/bin/python scripts/benchmark.py large-state --users 1000000 --events 20000
    .venv/bin/python scripts/benchmark.py small-state --users 100000 --events 10000 --increments 8
    .venv/bin/python scripts/benchmark.py long-run --increments 100 --events 200 --users 20000
    .venv/bin/python scripts/benchmark.py scheduler --increments 4 --events 50000 --users 20000
    .venv/bin/python scripts/benchmark.py scheduler --increments 4 --events 50000 --users 20000 --connect
    .venv/bin/python scripts/benchmark.py scheduler --workload large-state --increments 4 --events 20000 --users 1000000
    .venv/bin/python scripts/benchmark.py sink-upsert --events 20000 --users 1000000
    .venv/bin/python scripts/benchmark.py sink-upsert --events 20000 --users 10000000
    .venv/bin/python scripts/benchmark.py postgres --increments 2 --events 20000 --users 1000000
    .venv/bin/python scripts/benchmark.py state-io --users 1000000 --s3-long-run 70
    .venv/bin/python scripts/benchmark.py tasks --increments 6
    .venv/bin/python scripts/benchmark.py tasks-long-run --increments 200 --until 14:40
    .venv/bin/python scripts/benchmark.py tasks-long-run --increments 200 --until 23:58 --chain --connect
    .venv/bin/python scripts/benchmark.py tasks-upsert --increments 4 --events 20000 --users 1000000
    .venv/bin/python scripts/benchmark.py tasks-nojvm --increments 4 --events 20000 --users 100000
    .venv/bin/python scripts/benchmark.py kafka --increments 3 --events 1000000
    .venv/bin/python scripts/benchmark.py kafka-sink --increments 3 --events 1000000
    .venv/bin/python scripts/benchmark.py first-checkpoint --sizes 1000000,4000000 --increments 3 --rounds 3
    .venv/bin/python scripts/benchmark.py jit --sizes 250000,1000000,4000000 --rounds 2
    .venv/bin/python scripts/benchmark.py cdc --increments 3 --events 200000 --users 1000000 --snapshot-rows 2000000
    .venv/bin/python scripts/benchmark.py windows --increments 30 --events 1000000 --users 1000000

Each prints its Markdown, writes the raw figures to ``<work>/run/<section>.json`` and replaces
its own section of docs/benchmarks.md (unless ``--no-doc``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, is_dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import (  # noqa: E402
    cdc,
    firstcheckpoint,
    inprocess,
    jit,
    kafka,
    kafkasink,
    longrun,
    postgres,
    report,
    scheduler,
    sinkupsert,
    stateio,
    tasks,
    tasks_nojvm,
    tasks_upsert,
    windows,
)
from bench.workloads import WORKLOADS, DataSpec  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULTS = {  # mode: (increments, events per increment, users)
    "clickstream": (6, 200_000, 50_000),
    "large-state": (6, 20_000, 1_000_000),
    "small-state": (8, 10_000, 100_000),  # the large-state shape at the size most pipelines have
    "long-run": (100, 200, 20_000),
    "scheduler": (4, 50_000, 20_000),
    "sink-upsert": (3, 20_000, 1_000_000),  # increments: upserts of events/100**(n-1) ... events changed keys
    "postgres": (2, 20_000, 1_000_000),  # increments: rounds; events: changed keys; users: rows loaded
    "state-io": (6, 20_000, 1_000_000),  # the state write's keys and the large-state S3 run (+ a long S3 run)
    "tasks": (6, 200, 20_000),  # the state-io mode's small S3 pipeline as Airflow tasks (scheduler), S3 and local
    "tasks-long-run": (200, 200, 20_000),  # the tasks mode's S3 DAG alone, checkpoint after checkpoint
    "tasks-upsert": (4, 20_000, 1_000_000),  # Delta upsert sink vs delta-rs MERGE as tasks: checkpoints, changed, rows
    "tasks-nojvm": (
        4,
        20_000,
        100_000,
    ),  # driver-only steps with and without a JVM as tasks: checkpoints, changed, rows
    "kafka": (3, 1_000_000, 1),  # increments: rounds; events: records produced and read per round (no users)
    "kafka-sink": (3, 1_000_000, 1),  # increments: rounds; events: records landed and published per round
    "first-checkpoint": (3, 1_000_000, 1),  # per job of --sizes keys: the first checkpoint, then increments
    "jit": (1, 1, 1),  # --sizes keys, --rounds runs per JIT, each in a fresh process
    "cdc": (3, 200_000, 1_000_000),  # increments: rounds; events: row changes; users: rows of the streamed table
    "windows": (30, 1_000_000, 1_000_000),  # a steady stream: 5 minutes of event time per checkpoint
}
PNG = "benchmark-long-run.png"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=list(DEFAULTS))
    parser.add_argument("--work", type=Path, default=Path("/tmp/checkpoint-bench"), help="work directory")
    parser.add_argument("--increments", type=int, help="increments (checkpoints)")
    parser.add_argument("--events", type=int, help="events per increment (large-state: after the first)")
    parser.add_argument("--users", type=int, help="distinct keys")
    parser.add_argument("--pages", type=int, default=500, help="distinct pages")
    parser.add_argument(
        "--workload", choices=[*WORKLOADS, "small-state"], default="clickstream", help="scheduler mode's workload"
    )
    parser.add_argument(
        "--connect",
        action="store_true",
        help="scheduler mode: ours and SS on one warm Spark Connect server beside ours and SS embedded; "
        "tasks-long-run mode: the steps on one warm Spark Connect server",
    )
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--buckets", type=int, default=16, help="sink-upsert mode's bucket files per table (the Delta sink's default)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="state-io mode's measured rounds per engine; jit mode's runs per JIT; first-checkpoint mode's "
        "fresh jobs per size",
    )
    parser.add_argument(
        "--s3-long-run", type=int, default=70, help="state-io mode's checkpoints on S3 (each in a fresh process)"
    )
    parser.add_argument(
        "--sizes", default="1000000,4000000", help="first-checkpoint mode's keys (first checkpoint events) per job"
    )
    parser.add_argument(
        "--until", help="tasks-long-run mode: land no checkpoint after this UTC time (HH:MM), report those run"
    )
    parser.add_argument("--chain", action="store_true", help="tasks-long-run mode: a checkpoint in one task")
    parser.add_argument("--snapshot-rows", type=int, default=2_000_000, help="cdc mode's snapshotted table")
    parser.add_argument("--no-warmup", action="store_true", help="skip the unmeasured warm-up increment")
    parser.add_argument(
        "--no-doc", action="store_true", help="do not write docs/benchmarks.md (the long run's plot goes to <work>/run)"
    )
    parser.add_argument("--doc", type=Path, default=REPO / "docs" / "benchmarks.md")
    args = parser.parse_args(argv)
    increments, events, users = DEFAULTS["small-state" if args.workload == "small-state" else args.mode]
    args.increments = args.increments or increments
    args.events = args.events or events
    args.users = args.users or users
    if min(args.increments, args.events, args.users, args.pages) < 1:
        parser.error("--increments, --events, --users and --pages must be positive")
    return args


def jsonable(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    return str(value)


def deadline(until: str | None) -> float | None:
    """``HH:MM`` (UTC, today) as a ``time.time()``."""
    if until is None:
        return None
    hour, minute = (int(x) for x in until.split(":"))
    now = datetime.now(UTC)
    return now.replace(hour=hour, minute=minute, second=0, microsecond=0).timestamp()


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    work = args.work.resolve()
    # the long run builds its whole key set in checkpoint 1, so any later growth is the job's age
    workload = {
        "long-run": "large-state",
        "scheduler": args.workload,
        "sink-upsert": "large-state",
        "postgres": "large-state",
        "state-io": "large-state",
        "tasks": "large-state",
        "tasks-long-run": "large-state",
        "tasks-upsert": "large-state",  # its own rows (bench.tasks_upsert); the spec gives the sizes
        "tasks-nojvm": "large-state",  # its own rows and table (bench.tasks_nojvm); the spec gives the sizes
        "kafka": "large-state",
        "kafka-sink": "large-state",
        "first-checkpoint": "large-state",
        "jit": "large-state",
        "cdc": "large-state",  # its own tables (bench.cdc); the spec is unused
        "windows": "large-state",  # its own stream (bench.windows); the spec is unused
    }.get(args.mode, args.mode)
    scheduler_section = f"scheduler-{args.workload}" + ("-connect" if args.connect else "")
    section = {"scheduler": scheduler_section, "sink-upsert": f"sink-upsert-{args.users}"}.get(args.mode, args.mode)
    workload = {"small-state": "large-state"}.get(workload, workload)
    spec = DataSpec(workload, args.increments, args.events, args.users, args.pages, args.seed)
    if args.mode == "long-run":
        result = longrun.run(spec, work)
        longrun.plot(result["rows"], (work / "run" if args.no_doc else args.doc.parent) / PNG)
        text = report.render_longrun(result, PNG)
        ok = True
    elif args.mode == "sink-upsert":
        changed = [max(args.events // 10 ** (args.increments - i), 1) for i in range(1, args.increments + 1)]
        result = sinkupsert.run(args.users, changed, args.buckets, work, args.seed)
        text = sinkupsert.render(result)
        ok = not result["problems"]
    elif args.mode == "postgres":
        result = postgres.run(args.users, args.events, args.increments, work, args.seed)
        text = postgres.render(result)
        ok = not result["problems"]
    elif args.mode == "kafka":
        result = kafka.run(args.events, args.increments, work, args.seed)
        text = kafka.render(result)
        ok = not result["problems"]
    elif args.mode == "kafka-sink":
        result = kafkasink.run(args.events, args.increments, work, args.seed)
        text = kafkasink.render(result)
        ok = not result["problems"]
    elif args.mode == "first-checkpoint":
        sizes = [int(size) for size in args.sizes.split(",")]
        result = firstcheckpoint.run(sizes, args.events, args.increments, work, args.seed, args.pages, args.rounds)
        text = firstcheckpoint.render(result)
        ok = not result["problems"]
    elif args.mode == "jit":
        result = jit.run([int(size) for size in args.sizes.split(",")], args.rounds, work, args.seed, args.pages)
        text = jit.render(result)
        ok = not result["problems"]
    elif args.mode == "windows":
        result = windows.run(windows.WindowSpec(args.increments, args.events, args.users, args.seed), work)
        text = windows.render(result)
        ok = not result["problems"]
    elif args.mode == "cdc":
        result = cdc.run(args.users, args.events, args.snapshot_rows, args.increments, work)
        text = cdc.render(result)
        ok = not result["problems"]
    elif args.mode == "state-io":
        long_run = DataSpec("large-state", args.s3_long_run, 200, 20_000, args.pages, args.seed)  # the small pipeline
        result = stateio.run(spec, args.rounds, long_run, work)
        text = stateio.render(result)
        ok = not result["problems"]
    elif args.mode == "tasks":
        result = tasks.run(spec, work)
        text = tasks.render(result)
        ok = not result["problems"]
    elif args.mode == "tasks-long-run":
        result = tasks.run(
            spec, work, long_run=True, until=deadline(args.until), chain=args.chain, connect=args.connect
        )
        text = tasks.render_long(result)
        ok = not result["problems"]
    elif args.mode == "tasks-upsert":
        result = tasks_upsert.run(spec, work)
        text = tasks_upsert.render(result)
        ok = not result["problems"]
    elif args.mode == "tasks-nojvm":
        result = tasks_nojvm.run(spec, work)
        text = tasks_nojvm.render(result)
        ok = not result["problems"]
    elif args.mode == "scheduler":
        result = {**scheduler.run(spec, work, connect=args.connect), "title": args.workload}
        text = report.render_scheduler(result)
        ok = not result["problems"]
    else:
        result = {**inprocess.run(spec, work, warmup=not args.no_warmup), "title": section}
        text = report.render_inprocess(result)
        ok = not result["problems"]
    (work / "run" / f"{section}.json").write_text(json.dumps(result, indent=1, default=jsonable))
    print(text)
    if not ok:
        print("\nresults NOT written to the docs: the outputs are wrong", file=sys.stderr)
        return 1
    if not args.no_doc:
        report.write_doc(args.doc, section, text)
        print(f"wrote {args.doc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
