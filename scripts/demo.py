"""The demo: the example clickstream pipeline, five checkpoints through real Airflow and Spark.

Generates five increments of click events, runs one DAG run (checkpoint) per increment
with ``dag.test()`` against an isolated SQLite AIRFLOW_HOME, injects two faults on
purpose (a step attempt dies before acking; finalize dies right after writing
``_metadata``), then prints the checkpoint history and compares every table with a
ground truth computed independently with pandas.

    python scripts/demo.py [--home DIR] [--events-per-increment N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

FAULTS = {
    2: ("step.before_ack:checkpoint=2:attempt=1:step=step_page_views_table", "page-views step dies before its ack"),
    4: ("finalize.after_metadata:checkpoint=4", "finalize dies right after writing _metadata"),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", type=Path, default=REPO / ".airflow" / "demo", help="AIRFLOW_HOME (recreated)")
    parser.add_argument("--events-per-increment", type=int, default=5000)
    args = parser.parse_args()

    home = args.home.resolve()
    if home.exists():
        shutil.rmtree(home)
    home.mkdir(parents=True)
    os.environ.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
            "CLICKSTREAM_DIR": str(home / "clickstream"),
            "SPARK_LOCAL_IP": "127.0.0.1",
        }
    )
    os.environ.pop("CHECKPOINT_FAULTS", None)
    print(f"AIRFLOW_HOME={home} (SQLite); initialising the metadata database …", flush=True)
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, capture_output=True)

    import pandas as pd

    from airflow_provider_checkpoint.testing.clickstream import land_events, mismatches

    sys.path.insert(0, str(REPO / "dags"))
    from example_clickstream import dag  # noqa: E402  (after AIRFLOW_HOME is set)

    logging.getLogger("airflow").setLevel(logging.WARNING)
    landing = home / "clickstream" / "landing"
    job_dir = home / "checkpoints" / "example_clickstream"
    landed: list[pd.DataFrame] = []
    for increment in range(1, 6):
        landed.append(land_events(landing, f"events-{increment:03d}.json", args.events_per_increment, increment))
        fault, what = FAULTS.get(increment, ("", ""))
        os.environ["CHECKPOINT_FAULTS"] = fault
        print(
            f"\n== run {increment}: landed {args.events_per_increment} events"
            + (f"; injected fault: {what}" if fault else ""),
            flush=True,
        )
        started = time.monotonic()
        with airflow_output_to(home / "demo-airflow.log"):
            run = dag.test()
        print(f"   DAG run {run.run_id}: {run.state} in {time.monotonic() - started:.1f}s", flush=True)
        retried = [ti.task_id for ti in run.get_task_instances() if ti.try_number > 1]
        if retried:
            print(f"   retried by Airflow: {', '.join(retried)}")
        if run.state != "success" and increment == 4:
            print(
                "   checkpoint 4 is committed in storage (_metadata written); its sink commit is "
                "finished by the next run's trigger"
            )
    os.environ.pop("CHECKPOINT_FAULTS", None)

    print_history(job_dir)
    problems = mismatches(home / "clickstream" / "marts", pd.concat(landed))
    print("\nground truth (pandas over all input) vs tables:")
    for table in ("page_views", "user_totals", "events"):
        print(f"  {table:<12} {'MATCH' if table not in problems else 'MISMATCH: ' + problems[table]}")
    print(f"\nAirflow and Spark output: {home / 'demo-airflow.log'}")
    print(f"checkpoints: {job_dir}\ntables:      {home / 'clickstream' / 'marts'}")
    return 1 if problems else 0


@contextlib.contextmanager
def airflow_output_to(log: Path) -> Iterator[None]:
    """Send Airflow's and Spark's console output (file descriptors 1 and 2) to ``log``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with log.open("ab") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def print_history(job_dir: Path) -> None:
    print("\n  id  status     duration  records in  state size  files written  note")
    for path in sorted((job_dir / "_stats").glob("*.json"), key=lambda p: int(p.stem)):
        s = json.loads(path.read_text())
        steps = s.get("steps", {}).values()
        files = sum(m.get("state_files", 0) + m.get("sink_files_staged", 0) for m in steps)
        note = s.get("reason", "")
        duration = f"{s['duration_seconds']:.1f}s" if "duration_seconds" in s else "-"
        print(
            f"  {s['checkpoint_id']:>2}  {s['status']:<9}  {duration:>8}  {s.get('records_in', 0):>10}"
            f"  {s.get('state_size', 0):>9}B  {files:>13}  {note}"
        )


if __name__ == "__main__":
    sys.exit(main())
