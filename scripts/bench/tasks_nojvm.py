"""Tasks-nojvm mode: a step that reads and merges on the driver, with and without the JVM it does not need.

Under the real Airflow scheduler (LocalExecutor, services from ``tests/live/airflow_live.py``) the DAGs of
``scripts/bench/dags_nojvm`` (jobs in :mod:`bench.nojvm_jobs`): a files → Delta upsert job and a
PostgreSQL CDC → Delta upsert job, each twice: ``lazy`` (a step starts Spark only if it needs it, the
default) and ``eager`` (its step task starts the JVM before the step, as every step did before;
``CHECKPOINT_STEP_SPARK=eager``). Checkpoint 1: ``--users`` rows landed as one Parquet file, and the
table ``nojvm_rows`` of ``--users`` rows (the CDC source's snapshot, read by Spark); each later one:
``--events`` changed keys landed, and ``--events`` row changes (half updates, 30 % inserts, 20 %
deletes) committed. Each DAG runs once per checkpoint, lazy and eager alternating which goes first; task
durations come from the REST API. After the last checkpoint every Delta table is read back (delta-rs,
deletion vectors applied) and compared with pandas over the landed files, or a ``SELECT`` of the table.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from bench.cdc import _changes, _check, _fill
from bench.measure import log
from bench.scheduler import timings
from bench.tasks import task_seconds
from bench.tasks_upsert import batches, begin, differs
from bench.workloads import DataSpec

REPO = Path(__file__).resolve().parents[2]
JOBS = ("files", "cdc")
SIDES = ("lazy", "eager")


def run(spec: DataSpec, work: Path) -> dict[str, Any]:
    """``spec.increments`` checkpoints of each DAG; see the module's docstring."""
    from deltalake import DeltaTable

    sys.path.insert(0, str(REPO))
    from bench.nojvm_jobs import CONN_ID, TABLE
    from tests.live.airflow_live import running_airflow
    from tests.servers.postgres import start_server

    load, directory = begin(work, "tasks-nojvm-")
    root = directory / "tables"
    for side in SIDES:
        (root / side / "landing").mkdir(parents=True)
    (directory / "pg").mkdir()
    server = start_server(directory / "pg")
    env = {
        "BENCH_NOJVM_ROOT": str(root),
        f"AIRFLOW_CONN_{CONN_ID.upper()}": server.uri(),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "scripts")]),
    }
    rows: list[dict[str, Any]] = []
    truth = pd.DataFrame()
    problems: list[str] = []
    try:
        with server.connect() as db:
            _fill(db, TABLE, spec.users)
        dags = Path(__file__).parent / "dags_nojvm"
        dag_ids = tuple(f"bench_{job}_{side}" for job in JOBS for side in SIDES)
        with running_airflow(directory / "airflow", dags_folder=dags, dag_ids=dag_ids, extra_env=env) as live:
            for i, batch in enumerate(batches(spec), start=1):
                name = f"rows-{i:04d}.parquet"
                for side in SIDES:
                    landing = root / side / "landing"
                    pq.write_table(pa.Table.from_pandas(batch, preserve_index=False), landing / f".{name}")
                    os.rename(landing / f".{name}", landing / name)  # whole files only
                truth = pd.concat([truth[~truth.user.isin(batch.user)], batch]) if len(truth) else batch
                changes = 0
                if i > 1:
                    with server.connect() as db:
                        changes = _changes(db, TABLE, spec.users + (i - 2) * spec.events, spec.events)
                row: dict[str, Any] = {"checkpoint": i, "rows": len(batch), "changes": changes}
                for side in SIDES[:: 1 if i % 2 else -1]:
                    for job in JOBS:
                        dag_id = f"bench_{job}_{side}"
                        run_id = live.trigger(dag_id, {"checkpoint": i})
                        live.wait_for_run(dag_id, run_id, timeout=900)
                        row[dag_id] = timings(live, dag_id, run_id)
                rows.append(row)
                log(f"tasks-nojvm: checkpoint {i}: {summary(row)}")
            shutil.copytree(live.home / "logs", directory / "task-logs", dirs_exist_ok=True)
        with server.connect() as db:
            for side in SIDES:
                table = pa.table(DeltaTable(str(root / side / "files_table")).scan())  # deletion vectors applied
                problems += [f"files {side}: table differs from the ground truth"] if differs(table, truth) else []
                problems += [f"cdc {side}: {p}" for p in _check(db, TABLE, root / side / "cdc_table")]
    finally:
        server.stop()
    load.append(os.getloadavg()[0])
    log(f"tasks-nojvm: tables and task logs under {directory}")
    return {"users": spec.users, "events": spec.events, "rows": rows, "problems": problems, "load": load}


def summary(row: dict[str, Any]) -> str:
    return ", ".join(
        f"{job} step {task_seconds(row, f'bench_{job}_lazy', 'step'):.1f}s lazy vs "
        f"{task_seconds(row, f'bench_{job}_eager', 'step'):.1f}s eager"
        for job in JOBS
    )


def render(result: dict[str, Any]) -> str:
    later = result["rows"][1:]
    lines = [
        f"### A step without a JVM, as Airflow tasks ({result['users']:,} rows, {result['events']:,} changed keys "
        f"a checkpoint, {len(result['rows'])} checkpoints)",
        "",
    ]
    for job in JOBS:
        ratios = [
            task_seconds(r, f"bench_{job}_lazy", "step") / task_seconds(r, f"bench_{job}_eager", "step") for r in later
        ]
        median = statistics.median(ratios) if ratios else float("nan")
        lines.append(
            f"- {job}: step task without the JVM over with it, checkpoints 2 onwards: median **{median:.2f}**; "
            f"each: {', '.join(f'{r:.2f}' for r in ratios)}."
        )
    lines += [
        f"- Tables: {'; '.join(result['problems']) or 'all equal their ground truth (pandas, SELECT)'}.",
        "",
        f"Load average before and after the run (2 cores, shared with other jobs): "
        f"{', '.join(f'{x:.1f}' for x in result['load'])}.",
        "",
        "| checkpoint | job | changed | step s lazy | step s eager | step lazy / eager | trigger s lazy / eager "
        "| finalize s lazy / eager | run s lazy / eager |",
        "|---:|:--|---:|---:|---:|---:|:--|:--|:--|",
    ]
    for row in result["rows"]:
        for job in JOBS:
            lines.append(_table_row(row, job))
    return "\n".join([*lines, ""])


def _table_row(row: dict[str, Any], job: str) -> str:
    lazy, eager = (f"bench_{job}_{side}" for side in SIDES)
    step = (task_seconds(row, lazy, "step"), task_seconds(row, eager, "step"))
    changed = row["rows"] if job == "files" else row["changes"] or row["rows"]

    def pair(kind: str) -> str:
        return f"{task_seconds(row, lazy, kind):.1f} / {task_seconds(row, eager, kind):.1f}"

    runs = f"{row[lazy]['run_seconds']:.1f} / {row[eager]['run_seconds']:.1f}"
    return (
        f"| {row['checkpoint']} | {job} | {changed:,} | {step[0]:.2f} | {step[1]:.2f} | {step[0] / step[1]:.2f} "
        f"| {pair('trigger')} | {pair('fin')} | {runs} |"
    )
