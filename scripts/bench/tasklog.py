"""Where a task's seconds go, from its Airflow task log: each line's offset from the task's first line.

    .venv/bin/python scripts/bench/tasklog.py <airflow logs dir> <dag_id> [<run_id substring>] [--task step]

Airflow writes a task log as JSON lines (``timestamp``, ``event``); the provider logs one line per phase
(the step's session start, each node with its seconds, the ack), so the gaps between lines are the
budget of docs/benchmarks.md ("Where a task's time goes").
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from pathlib import Path


def lines(path: Path) -> list[tuple[datetime, str]]:
    """The timestamped events of one task log, in order."""
    found = []
    for raw in path.read_text().splitlines():
        try:
            record = json.loads(raw)
            stamp = datetime.fromisoformat(str(record["timestamp"]).replace("Z", "+00:00"))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
        found.append((stamp, str(record.get("event", ""))))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", type=Path)
    parser.add_argument("dag_id")
    parser.add_argument("run", nargs="?", default="")
    parser.add_argument("--task", default="", help="only tasks whose id contains this")
    parser.add_argument("--width", type=int, default=140)
    args = parser.parse_args()
    runs = f"run_id=*{args.run}*" if args.run else "run_id=*"  # "**" is no pattern of one component
    tasks = f"task_id=*{args.task}*/attempt=*.log" if args.task else "task_id=*/attempt=*.log"
    for run in sorted((args.logs / f"dag_id={args.dag_id}").glob(runs)):
        for path in sorted(run.glob(tasks)):
            events = lines(path)
            if not events:
                continue
            start = events[0][0]
            print(f"== {run.name} {path.parent.name} ({(events[-1][0] - start).total_seconds():.2f}s)")
            for stamp, event in events:
                print(f"{(stamp - start).total_seconds():7.2f}  {event[: args.width]}")


if __name__ == "__main__":
    main()
