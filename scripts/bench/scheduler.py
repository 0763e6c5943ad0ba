"""Scheduler mode: every side as a DAG under the real Airflow scheduler (LocalExecutor).

Services come from the live-test harness (``tests/live/airflow_live.py``: isolated
AIRFLOW_HOME, 127.0.0.1). Per increment the data is landed, then each DAG (ours in three
tasks, ours chained into one task, SS) runs once, the order rotating per increment; every
task is a fresh process starting its own SparkSession. Task durations and scheduler gaps
(run time not covered by any task) come from the REST API.

``connect``: one Spark Connect server (``SparkConnectServer`` from the pyspark installation, loopback, the
provider's :func:`~airflow_provider_checkpoint.spark.session.connect_server_conf`) started before the first
increment and kept for the whole run, as an operator runs ``start-connect-server.sh``; ``bench_connect`` (ours,
three tasks, its steps on the server), ``bench_connect_chained`` (the same in one task, ``chain=True``) and
``bench_ss_connect`` (SS's query on it) run beside ``bench_ss`` (``bench_ours`` and ``bench_chained``, embedded, are
left out of such a run: the scheduler mode without ``connect`` measures them).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pandas as pd

from bench.measure import log
from bench.workloads import DataSpec, generate, ground_truth, land, normalized, read_parquet_dir

REPO = Path(__file__).resolve().parents[2]
DAG_IDS = ("bench_ours", "bench_chained", "bench_ss")
CONNECT_DAG_IDS = ("bench_ss", "bench_connect", "bench_connect_chained", "bench_ss_connect")
CONNECT_CONN_ID = "bench_spark_connect"
"""The connection ``bench_connect``'s steps run through (its DAG file names it too)."""


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


@contextlib.contextmanager
def warm_connect(root: Path, server_env: Mapping[str, str] | None = None) -> Iterator[dict[str, str]]:
    """A Spark Connect server for the whole run, with ``server_env`` in its environment (e.g. the S3 server's
    credentials and endpoint, which its executors read through fsspec); yield the environment its DAGs need (the
    connection :data:`CONNECT_CONN_ID`, the URL)."""
    from airflow_provider_checkpoint.spark.session import connect_server_conf
    from tests.live.spark_connect import spark_connect_server

    os.environ.update(server_env or {})
    os.environ["PYSPARK_PYTHON"] = sys.executable  # the server's Python workers (foreachBatch, the daemon)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "scripts"), os.environ.get("PYTHONPATH")]))
    began = time.monotonic()
    with spark_connect_server(root / "spark-connect.log", conf=connect_server_conf()) as url:
        log(f"Spark Connect server at {url} up in {time.monotonic() - began:.1f}s")
        host, port = url.removeprefix("sc://").rsplit(":", 1)
        conn = {"conn_type": "spark_connect", "host": host, "port": int(port)}
        yield {"BENCH_CONNECT_URL": url, f"AIRFLOW_CONN_{CONNECT_CONN_ID.upper()}": json.dumps(conn)}


def run(spec: DataSpec, work: Path, connect: bool = False) -> dict[str, Any]:
    """Run the DAGs once per increment (with ``connect``, :data:`CONNECT_DAG_IDS` beside a warm Spark Connect
    server); their timings and whether every table is correct."""
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
    dag_ids = CONNECT_DAG_IDS if connect else DAG_IDS
    rows: list[dict[str, Any]] = []
    frames: list[pd.DataFrame] = []
    with contextlib.ExitStack() as stack:
        if connect:
            env.update(stack.enter_context(warm_connect(root)))
        live = stack.enter_context(
            running_airflow(root, dags_folder=Path(__file__).parent / "dags", dag_ids=dag_ids, extra_env=env)
        )
        for i, data_file in enumerate(files, start=1):
            frames.append(spec.increment(i))
            land(data_file, base / "landing")
            shift = (i - 1) % len(dag_ids)  # the order rotates by one per increment
            order = dag_ids[shift:] + dag_ids[:shift]
            row: dict[str, Any] = {"increment": i, "first": order[0]}
            for dag_id in order:
                run_id = live.trigger(dag_id, {"increment": i})
                live.wait_for_run(dag_id, run_id, timeout=900)
                row[dag_id] = timings(live, dag_id, run_id)
            rows.append(row)
            row["load"] = os.getloadavg()[0]
            log(
                f"increment {i} (load {row['load']:.1f}): "
                + " | ".join(f"{d} {row[d]['run_seconds']:.1f}s" for d in dag_ids)
            )
    truth = ground_truth(pd.concat(frames, ignore_index=True))
    problems: dict[str, str] = {}
    for name, table in ((dag_id, base / dag_id.removeprefix("bench_") / "table") for dag_id in dag_ids):
        try:
            pd.testing.assert_frame_equal(normalized(read_parquet_dir(table)), truth)
        except AssertionError as e:
            problems[name] = str(e)
    load.append(os.getloadavg()[0])
    return {
        "spec": spec,
        "dag_ids": list(dag_ids),
        "rows": rows,
        "problems": problems,
        "truth_rows": len(truth),
        "load": ", ".join(f"{x:.1f}" for x in load),
    }
