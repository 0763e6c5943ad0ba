"""Tasks mode: the object-store benchmark's small pipeline as users run it, every task a fresh process.

Under the real Airflow scheduler (LocalExecutor, services from ``tests/live/airflow_live.py``) the DAGs
of ``scripts/bench/dags_tasks``: ``bench_s3`` (landing area, tables and checkpoint storage on the S3
server of ``tests/servers``, SeaweedFS, logging every request) and ``bench_local`` (the same on local
disk), each a trigger, a step and a finalize task; and ``bench_empty``, one task doing nothing (the
floor of any task). Per checkpoint the increment is landed on both, then each DAG runs once, S3 and
local alternating which goes first. Each task's duration comes from the REST API; the requests the S3
run sent, by kind, from the server's log (landing not counted). At the end both pipelines' tables are
read back (pyarrow, delta-rs) and compared with a pandas ground truth; the task logs are kept under
the work directory for the time budget (docs/benchmarks.md).

The long run (``long_run``) runs ``bench_s3`` alone, checkpoint after checkpoint, until ``spec.increments``
or ``until`` (a ``time.time()``), whichever comes first: its time and requests per checkpoint against the
job's age (:func:`render_long`). With ``connect`` its steps run on one warm Spark Connect server started before
the first checkpoint and kept for the whole run (the scheduler mode's :func:`~bench.scheduler.warm_connect`,
the S3 server's credentials in its environment).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from bench.measure import log
from bench.objectstore import KINDS, check_tables, land
from bench.scheduler import CONNECT_CONN_ID, timings, warm_connect
from bench.workloads import DataSpec

REPO = Path(__file__).resolve().parents[2]
DAG_IDS = ("bench_s3", "bench_local", "bench_empty")
S3_OVER_LOCAL = 1.5
FLAT = 1.2
"""The long run: the last checkpoints' median time and requests over the first ones' (after the first): at most."""
EDGE = 20
"""The long run compares its first and last this many checkpoints (the first one, the whole key set, left out)."""

COMPACT_EVERY = 10
"""A state range's deltas are compacted every this many checkpoints (``MAX_DELTAS``): checkpoints 11, 21, …"""


def every_tenth(rows: list[dict[str, Any]], value: Callable[[dict[str, Any]], float]) -> list[float]:
    """For each checkpoint 11, 21, … (:data:`COMPACT_EVERY`) with all of its nine predecessors (from checkpoint 2)
    in ``rows``: its ``value`` over the median of theirs, so a load that drifts during the run cancels out."""
    by_number = {r["checkpoint"]: r for r in rows}
    ratios = []
    for n in sorted(by_number):
        before = [by_number.get(m) for m in range(n - COMPACT_EVERY + 1, n)]
        if n % COMPACT_EVERY == 1 and n > COMPACT_EVERY and all(before):
            ratios.append(value(by_number[n]) / statistics.median(value(r) for r in before if r))
    return ratios


def run(
    spec: DataSpec,
    work: Path,
    long_run: bool = False,
    until: float | None = None,
    chain: bool = False,
    connect: bool = False,
) -> dict[str, Any]:
    """``spec.increments`` checkpoints of each DAG, or of ``bench_s3`` alone for the ``long_run``; see the
    module's docstring. ``chain``: each checkpoint one task (``BENCH_CHAIN``); ``connect``: the steps on a warm
    Spark Connect server (``BENCH_SPARK_CONN_ID``)."""
    import s3fs

    sys.path.insert(0, str(REPO))
    from tests.live.airflow_live import running_airflow
    from tests.servers.s3 import AccessLog, start_server

    load = [os.getloadavg()[0]]
    (work / "run").mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="tasks-", dir=work))
    (directory / "s3").mkdir()
    process, server = start_server(directory / "s3", access_log=True)
    s3 = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False, **server.storage_options())
    local = f"file://{directory}/local"
    roots = {"small@s3": server.url("bench"), **({} if long_run else {"small@local": local})}
    env = {
        **server.env(),
        "BENCH_S3_ROOT": roots["small@s3"],
        "BENCH_LOCAL_ROOT": local,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "scripts")]),  # this checkout, whatever is installed
        "BENCH_CHAIN": "1" if chain else "0",
    }
    access = AccessLog(directory / "s3")
    landed: list[pd.DataFrame] = []
    rows: list[dict[str, Any]] = []
    dags = Path(__file__).parent / "dags_tasks"
    try:
        with contextlib.ExitStack() as stack:
            if connect:
                env.update(stack.enter_context(warm_connect(directory, server.env())))
                env["BENCH_SPARK_CONN_ID"] = CONNECT_CONN_ID
            live = stack.enter_context(
                running_airflow(directory / "airflow", dags_folder=dags, dag_ids=DAG_IDS, extra_env=env)
            )
            for i in range(1, spec.increments + 1):
                events = spec.increment(i)
                landed.append(events)
                for root in roots.values():
                    land(s3, root, f"inc-{i:04d}.json", events.to_json(orient="records", lines=True).encode())
                row: dict[str, Any] = {"checkpoint": i, "events": len(events), "load": os.getloadavg()[0]}
                for dag_id in ["bench_s3"] if long_run else [*DAG_IDS[:2][:: 1 if i % 2 else -1], "bench_empty"]:
                    access.since()
                    run_id = live.trigger(dag_id, {"checkpoint": i})
                    live.wait_for_run(dag_id, run_id, timeout=900)
                    row[dag_id] = timings(live, dag_id, run_id)
                    if dag_id == "bench_s3":
                        counts = Counter(r.kind for r in access.since())
                        row["requests"] = {k: counts.get(k, 0) for k in KINDS}
                rows.append(row)
                log(f"tasks: checkpoint {i}: {summary(row)}")
                if until is not None and time.time() > until:
                    log(f"tasks: stopped after checkpoint {i} of {spec.increments}: its deadline has passed")
                    break
            shutil.copytree(live.home / "logs", directory / "task-logs", dirs_exist_ok=True)
        problems = check_tables(s3, server, roots, landed)
    finally:
        process.terminate()
        process.wait(timeout=15)
    load.append(os.getloadavg()[0])
    log(f"tasks: logs and task logs under {directory}")
    return {
        "users": spec.users,
        "events": spec.events,
        "rows": rows,
        "problems": problems,
        "load": load,
        "chain": chain,
        "connect": connect,
    }


def summary(row: dict[str, Any]) -> str:
    parts = [
        f"{dag_id} {row[dag_id]['run_seconds']:.1f}s ("
        + ", ".join(f"{t} {s:.1f}" for t, s in row[dag_id]["tasks"].items())
        + ")"
        for dag_id in DAG_IDS
        if dag_id in row
    ]
    return ", ".join(parts) + f", requests {sum(row['requests'].values())}"


def task_seconds(row: dict[str, Any], dag_id: str, kind: str) -> float:
    """The duration of the task of ``dag_id`` whose id ends with ``kind`` (trigger, step, finalize)."""
    return sum(s for t, s in row[dag_id]["tasks"].items() if t.split(".")[-1].startswith(kind))


def render(result: dict[str, Any]) -> str:
    rows = result["rows"]
    later = rows[1:] or rows
    tasks_ratio = statistics.median(
        sum(row["bench_s3"]["tasks"].values()) / sum(row["bench_local"]["tasks"].values()) for row in later
    )
    met = "met" if tasks_ratio <= S3_OVER_LOCAL else "**not met**"
    totals = [sum(row["requests"].values()) for row in rows]
    lines = [
        f"### A small checkpoint on S3 as Airflow tasks ({result['users']:,} keys, {result['events']:,} events "
        f"a checkpoint, {len(rows)} checkpoints)",
        "",
        f"- S3 over local disk, sum of the three tasks, median of checkpoints 2 onwards: **{tasks_ratio:.2f}** "
        f"— {met} (target ≤ {S3_OVER_LOCAL}).",
        f"- Requests per checkpoint: {min(totals)}–{max(totals)}.",
        f"- Tables: {'; '.join(result['problems']) or 'both equal the pandas ground truth'}.",
        "",
        f"Load average before and after the run (2 cores, shared with other jobs): "
        f"{', '.join(f'{x:.1f}' for x in result['load'])}.",
        "",
        "| checkpoint | events | local trigger | step | finalize | S3 trigger | step | finalize | S3/local tasks "
        "| empty task | " + " | ".join(KINDS[:5]) + " | total |",
        "|---:|---:|" + "---:|" * 8 + "---:|" * 6,
    ]
    for row, total in zip(rows, totals, strict=True):
        local = [task_seconds(row, "bench_local", k) for k in ("trigger", "step", "finalize")]
        s3 = [task_seconds(row, "bench_s3", k) for k in ("trigger", "step", "finalize")]
        empty = sum(row["bench_empty"]["tasks"].values())
        counts = " | ".join(str(row["requests"][k]) for k in KINDS[:5])
        lines.append(
            f"| {row['checkpoint']} | {row['events']:,} | "
            + " | ".join(f"{s:.2f}" for s in (*local, *s3))
            + f" | {sum(s3) / sum(local):.2f} | {empty:.2f} | {counts} | {total} |"
        )
    return "\n".join([*lines, ""])


def render_long(result: dict[str, Any]) -> str:
    """The long run: time (the tasks, the DAG run) and requests per checkpoint, the first :data:`EDGE` checkpoints
    after the first against the last :data:`EDGE`."""
    rows = result["rows"]
    first, last = rows[1 : EDGE + 1], rows[max(1, len(rows) - EDGE) :]  # checkpoint 1 builds the key set

    def tasks_s(row: dict[str, Any]) -> float:
        return sum(row["bench_s3"]["tasks"].values())

    def figures(part: list[dict[str, Any]]) -> dict[str, float]:
        return {
            "tasks": statistics.median(tasks_s(r) for r in part),
            "run": statistics.median(r["bench_s3"]["run_seconds"] for r in part),
            "requests": statistics.median(sum(r["requests"].values()) for r in part),
            "requests_max": max(sum(r["requests"].values()) for r in part),
            "load": statistics.median(r["load"] for r in part),
        }

    early, late = figures(first), figures(last)
    spike_time = every_tenth(rows, tasks_s)
    spike_requests = every_tenth(rows, lambda r: sum(r["requests"].values()))
    ratios = {k: late[k] / early[k] for k in ("tasks", "run", "requests", "requests_max")}
    flat = all(ratios[k] <= FLAT for k in ("tasks", "requests", "requests_max"))
    lines = [
        f"### {len(rows)} checkpoints on S3 as Airflow tasks: time and requests against the job's age "
        f"({result['users']:,} keys, then {result['events']:,} events a checkpoint)",
        "",
        f"- Last {len(last)} over first {len(first)} (checkpoints {first[0]['checkpoint']}–{first[-1]['checkpoint']} "
        f"and {last[0]['checkpoint']}–{last[-1]['checkpoint']}), medians: tasks ×{ratios['tasks']:.2f}, "
        f"DAG run ×{ratios['run']:.2f}, requests ×{ratios['requests']:.2f} (largest ×{ratios['requests_max']:.2f}) "
        f"— {'flat: met' if flat else '**not flat**'} (target: ≤ ×{FLAT}).",
        spike_line(spike_time, spike_requests),
        f"- Tables: {'; '.join(result['problems']) or 'equal the pandas ground truth'}.",
        "",
        f"Load average before and after the run (2 cores, shared with other jobs): "
        f"{', '.join(f'{x:.1f}' for x in result['load'])}.",
        "",
        f"Each checkpoint a DAG run of {'one task (`chain=True`)' if result['chain'] else 'three tasks'}, "
        "every task a fresh process under the real scheduler (LocalExecutor)"
        + (", its step on one warm Spark Connect server started before the first." if result.get("connect") else "."),
        "",
        "| checkpoints | load (median) | trigger s | step s | finalize s | tasks s | DAG run s "
        "| requests (median / max) |",
        "|:--|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for part, figs in ((first, early), (last, late)):
        kinds = [
            statistics.median(task_seconds(r, "bench_s3", k) for r in part) for k in ("trigger", "step", "finalize")
        ]
        lines.append(
            f"| {part[0]['checkpoint']}–{part[-1]['checkpoint']} | {figs['load']:.1f} | "
            + " | ".join("—" if result["chain"] else f"{s:.2f}" for s in kinds)
            + f" | {figs['tasks']:.2f} | {figs['run']:.2f} | {figs['requests']:.0f} / {figs['requests_max']} |"
        )
    return "\n".join([*lines, ""])


def spike_line(time_ratios: list[float], request_ratios: list[float]) -> str:
    """The every-tenth-checkpoint line: each such checkpoint's tasks time and requests over its nine predecessors'."""
    if not time_ratios:
        return f"- Every tenth checkpoint: none with its {COMPACT_EVERY - 1} predecessors in this run."
    gone = statistics.median(time_ratios) <= FLAT
    return (
        f"- Every tenth checkpoint (11, 21, …; {len(time_ratios)} of them) over its {COMPACT_EVERY - 1} predecessors: "
        f"tasks ×{statistics.median(time_ratios):.2f} median (×{min(time_ratios):.2f}–×{max(time_ratios):.2f}), "
        f"requests ×{statistics.median(request_ratios):.2f} (largest ×{max(request_ratios):.2f}) — "
        + ("no time spike." if gone else f"**a time spike** (over ×{FLAT}).")
    )
