"""Scheduler mode: every side as a DAG under the real Airflow scheduler (LocalExecutor).

Services come from the live-test harness (``tests/live/airflow_live.py``: isolated
AIRFLOW_HOME, 127.0.0.1). Per increment the data is landed, then each DAG (ours in three
tasks, ours chained into one task, SS) runs once, the order rotating per increment; every
task is a fresh process starting its own SparkSession. Task durations and scheduler gaps
(run time not covered by any task) come from the REST API.
"""

from __future__ import annotations

import os
import shutil
import sys
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pandas as pd

from bench.measure import log
from bench.workloads import DataSpec, generate, ground_truth, land, normalized, read_parquet_dir

REPO = Path(__file__).resolve().parents[2]
DAG_IDS = ("bench_ours", "bench_chained", "bench_ss")


def seconds_covered(intervals: list[tuple[datetime, datetime]]) -> float:
    """Length of the union of the intervals."""
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += (b - a).total_seconds()
            end = b
        elif b > end:
            total += (b - end).total_seconds()
            end = b
    return total


def timings(live: Any, dag_id: str, run_id: str) -> dict[str, Any]:
    """Run duration, each task's duration and the gaps between them, from the REST API."""
    run = live.run(dag_id, run_id)
    tis = live.api_json("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances")[
        "task_instances"
    ]
    start, end = datetime.fromisoformat(run["start_date"]), datetime.fromisoformat(run["end_date"])
    spans = [(datetime.fromisoformat(t["start_date"]), datetime.fromisoformat(t["end_date"])) for t in tis]
    run_seconds = (end - start).total_seconds()
    return {
        "run_seconds": run_seconds,
        "tasks": {t["task_id"]: t["duration"] for t in tis},
        "gap_seconds": run_seconds - seconds_covered(spans),
    }


def run(spec: DataSpec, work: Path) -> dict[str, Any]:
    """Run both DAGs once per increment; their timings and whether both tables are correct."""
    sys.path.insert(0, str(REPO))
    from tests.live.airflow_live import running_airflow

    load = [os.getloadavg()[0]]
    files = generate(work / "data" / spec.workload, spec)
    root = work / "run" / "scheduler"
    if root.exists():
        shutil.rmtree(root)
    base = root / "bench"
    (base / "landing").mkdir(parents=True)
    env = {"BENCH_DIR": str(base), "PYTHONPATH": str(REPO / "scripts")}
    rows: list[dict[str, Any]] = []
    frames: list[pd.DataFrame] = []
    with running_airflow(root, dags_folder=Path(__file__).parent / "dags", dag_ids=DAG_IDS, extra_env=env) as live:
        for i, data_file in enumerate(files, start=1):
            frames.append(spec.increment(i))
            land(data_file, base / "landing")
            shift = (i - 1) % len(DAG_IDS)  # the order rotates by one per increment
            order = DAG_IDS[shift:] + DAG_IDS[:shift]
            row: dict[str, Any] = {"increment": i, "first": order[0]}
            for dag_id in order:
                run_id = live.trigger(dag_id, {"increment": i})
                live.wait_for_run(dag_id, run_id, timeout=900)
                row[dag_id] = timings(live, dag_id, run_id)
            rows.append(row)
            log(f"increment {i}: " + " | ".join(f"{d} {row[d]['run_seconds']:.1f}s" for d in DAG_IDS))
    truth = ground_truth(pd.concat(frames, ignore_index=True))
    problems: dict[str, str] = {}
    for name, table in ((dag_id, base / dag_id.removeprefix("bench_") / "table") for dag_id in DAG_IDS):
        try:
            pd.testing.assert_frame_equal(normalized(read_parquet_dir(table)), truth)
        except AssertionError as e:
            problems[name] = str(e)
    load.append(os.getloadavg()[0])
    return {
        "spec": spec,
        "rows": rows,
        "problems": problems,
        "truth_rows": len(truth),
        "load": ", ".join(f"{x:.1f}" for x in load),
    }
