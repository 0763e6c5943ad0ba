"""Tasks-upsert mode: the Delta upsert sink against delta-rs ``MERGE`` of the same rows, as Airflow tasks.

Under the real Airflow scheduler (LocalExecutor, services from ``tests/live/airflow_live.py``) the DAGs of
``scripts/bench/dags_upsert``: ``bench_delta_upsert`` (``FileSource`` of landed Parquet files →
``DeltaTableSink`` upsert by ``user``: trigger, step, finalize, each a fresh task process) and
``bench_delta_merge`` (one task: the landed file read with pyarrow, then delta-rs ``write_deltalake`` the first
time, ``MERGE`` after). Checkpoint 1 lands ``--users`` rows (the table), each later one ``--events`` changed keys
drawn uniformly (new totals); each DAG runs once per checkpoint, the order alternating. Compared: the sink's
phases as its tasks log them (the step's ``sink upsert`` phase + the finalize's Delta commit) against the
``MERGE`` call (its task logs it), and the task durations (REST API). Both tables are read back with delta-rs
and compared with a pandas ground truth after the last checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from bench.measure import log
from bench.scheduler import timings
from bench.workloads import DataSpec

REPO = Path(__file__).resolve().parents[2]
DAG_IDS = ("bench_delta_upsert", "bench_delta_merge")
TARGET = 1.0
PHASES = {  # what each task logs, the seconds captured
    "stage": re.compile(r"^sink upsert: (?!checkpoint \d+ committed).* in ([0-9.]+)s$"),
    "commit": re.compile(r"^sink upsert: checkpoint \d+ committed as Delta version .* in ([0-9.]+)s$"),
    "merge": re.compile(r"^merge: \d+ rows in ([0-9.]+)s"),
    "read": re.compile(r"^merge: .*\(read ([0-9.]+)s\)$"),
    "source": re.compile(r"^source rows: .* in ([0-9.]+)s$"),
}


def batches(spec: DataSpec) -> list[pd.DataFrame]:
    """The whole table, then ``spec.events`` changed keys per later checkpoint (deterministic in the seed)."""
    rng = np.random.default_rng(spec.seed)
    table = pd.DataFrame({"user": np.arange(spec.users, dtype=np.int64), "total": rng.integers(0, 1000, spec.users)})
    table["label"] = "u" + table["user"].astype(str)
    changed = [
        table.sample(spec.events, random_state=spec.seed + i).assign(total=-i) for i in range(1, spec.increments)
    ]
    return [table, *changed]


def begin(work: Path, prefix: str) -> tuple[list[float], Path]:
    """The load average now, and a new directory under ``work`` for one run (``work/run`` made for its figures)."""
    (work / "run").mkdir(parents=True, exist_ok=True)
    return [os.getloadavg()[0]], Path(tempfile.mkdtemp(prefix=prefix, dir=work))


def phase_seconds(logs: Path, dag_id: str, run_id: str) -> dict[str, float]:
    """The phases :data:`PHASES` the run's task logs name (a phase logged twice is summed)."""
    found: dict[str, float] = {}
    for path in (logs / f"dag_id={dag_id}" / f"run_id={run_id}").glob("task_id=*/attempt=*.log"):
        for line in path.read_text().splitlines():
            try:
                event = str(json.loads(line).get("event", ""))
            except (json.JSONDecodeError, AttributeError):
                continue
            for name, pattern in PHASES.items():
                if m := pattern.match(event):
                    found[name] = found.get(name, 0.0) + float(m.group(1))
    return found


def run(spec: DataSpec, work: Path) -> dict[str, Any]:
    """``spec.increments`` checkpoints of each DAG; see the module's docstring."""
    from deltalake import DeltaTable

    sys.path.insert(0, str(REPO))
    from tests.live.airflow_live import running_airflow

    load, directory = begin(work, "tasks-upsert-")
    root = directory / "tables"
    (root / "landing").mkdir(parents=True)
    env = {"BENCH_UPSERT_ROOT": str(root), "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "scripts")])}
    # the source's driver_read_bytes (0: Spark reads the landed file); CHECKPOINT_STEP_SPARK=eager: the step task
    # starts its JVM before the step, as before steps started Spark on first use
    env.update({k: os.environ[k] for k in ("BENCH_DRIVER_READ_BYTES", "CHECKPOINT_STEP_SPARK") if k in os.environ})
    rows: list[dict[str, Any]] = []
    truth = pd.DataFrame()
    dags = Path(__file__).parent / "dags_upsert"
    with running_airflow(directory / "airflow", dags_folder=dags, dag_ids=DAG_IDS, extra_env=env) as live:
        for i, batch in enumerate(batches(spec), start=1):
            name = f"rows-{i:04d}.parquet"
            pq.write_table(pa.Table.from_pandas(batch, preserve_index=False), root / "landing" / f".{name}")
            os.rename(root / "landing" / f".{name}", root / "landing" / name)  # whole files only
            truth = pd.concat([truth[~truth.user.isin(batch.user)], batch]) if len(truth) else batch
            row: dict[str, Any] = {"checkpoint": i, "rows": len(batch)}
            for dag_id in DAG_IDS[:: 1 if i % 2 else -1]:
                run_id = live.trigger(dag_id, {"file": name})
                live.wait_for_run(dag_id, run_id, timeout=900)
                phases = phase_seconds(live.home / "logs", dag_id, run_id)
                row[dag_id] = {**timings(live, dag_id, run_id), "phases": phases}
            rows.append(row)
            log(f"tasks-upsert: checkpoint {i}: {summary(row)}")
        shutil.copytree(live.home / "logs", directory / "task-logs", dirs_exist_ok=True)
    problems = [
        f"{side}: table differs from the ground truth"
        for side in ("upsert", "merge")
        if differs(pa.table(DeltaTable(str(root / side)).scan()), truth)  # scan() applies deletion vectors
    ]
    load.append(os.getloadavg()[0])
    log(f"tasks-upsert: tables and task logs under {directory}")
    return {"users": spec.users, "events": spec.events, "rows": rows, "problems": problems, "load": load}


def differs(got: pa.Table, truth: pd.DataFrame) -> bool:
    """Whether ``got`` holds other rows than ``truth`` (one row per user)."""
    got = got.set_column(got.schema.get_field_index("label"), "label", got.column("label").cast(pa.string()))
    frame = got.to_pandas().sort_values("user").reset_index(drop=True)
    want = truth.sort_values("user").reset_index(drop=True)
    return len(frame) != len(want) or not frame[["user", "total", "label"]].equals(want[["user", "total", "label"]])


def ours(row: dict[str, Any]) -> float:
    """The sink's seconds: the step's stage phase + the finalize's Delta commit."""
    phases = row["bench_delta_upsert"]["phases"]
    return float(phases.get("stage", 0.0) + phases.get("commit", 0.0))


def summary(row: dict[str, Any]) -> str:
    upsert, merge = row["bench_delta_upsert"], row["bench_delta_merge"]
    return (
        f"{row['rows']:,} rows: sink {ours(row):.3f}s ({upsert['phases']}), MERGE "
        f"{merge['phases'].get('merge', 0.0):.3f}s; tasks "
        + ", ".join(f"{t} {s:.1f}" for t, s in upsert["tasks"].items())
        + f" vs {sum(merge['tasks'].values()):.1f}"
    )


def render(result: dict[str, Any]) -> str:
    later = result["rows"][1:]
    ratios = [ours(r) / r["bench_delta_merge"]["phases"]["merge"] for r in later]
    ratio = statistics.median(ratios) if ratios else float("nan")
    met = "met" if ratio <= TARGET else "**not met**"
    lines = [
        f"### The Delta upsert against delta-rs MERGE as Airflow tasks ({result['users']:,} rows, "
        f"{result['events']:,} changed keys a checkpoint, {len(result['rows'])} checkpoints)",
        "",
        f"- Sink (step's `sink upsert` phase + finalize's Delta commit) over `MERGE`, median of checkpoints 2 "
        f"onwards: **{ratio:.2f}** — {met} (target ≤ {TARGET}); each: {', '.join(f'{r:.2f}' for r in ratios)}.",
        f"- Tables: {'; '.join(result['problems']) or 'both equal the pandas ground truth'}.",
        "",
        f"Load average before and after the run (2 cores, shared with other jobs): "
        f"{', '.join(f'{x:.1f}' for x in result['load'])}.",
        "",
        "| checkpoint | rows | sink stage s | sink commit s | sink total s | MERGE s | sink / MERGE "
        "| source read s | MERGE's read s | trigger task s | step task s | finalize task s | MERGE task s |",
        "|---:|---:|" + "---:|" * 11,
    ]
    for row in result["rows"]:
        upsert, merge = row["bench_delta_upsert"], row["bench_delta_merge"]
        phases, tasks = upsert["phases"], upsert["tasks"]
        anchor = merge["phases"].get("merge", float("nan"))
        kinds = [sum(s for t, s in tasks.items() if t.split(".")[-1].startswith(k)) for k in ("trigger", "step", "fin")]
        lines.append(
            f"| {row['checkpoint']} | {row['rows']:,} | {phases.get('stage', 0.0):.3f} "
            f"| {phases.get('commit', 0.0):.3f} | {ours(row):.3f} | {anchor:.3f} | {ours(row) / anchor:.2f} "
            f"| {phases.get('source', float('nan')):.3f} | {merge['phases'].get('read', float('nan')):.3f} | "
            + " | ".join(f"{s:.2f}" for s in kinds)
            + f" | {sum(merge['tasks'].values()):.2f} |"
        )
    return "\n".join([*lines, ""])
