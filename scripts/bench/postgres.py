"""PostgresTableSink: step load rate against the physical floor, and finalize times, in one run.

Starts PostgreSQL the way the tests do (:func:`tests.servers.postgres.start_server`). Per round,
in a fresh schema, with narrow rows ``(id bigint, label text, value double precision)``:

- **floor**: one plain psycopg ``COPY`` of the same rows from the driver (Arrow-written CSV into
  a logged table, like the staging table), measured before and after the sinks' loads;
- **append**: checkpoint 1 stages ``rows`` rows (the step's load rate) and commits them;
  checkpoint 2 appends ``changed`` rows (finalize time into a ``rows``-row table);
- **upsert**: the same, keyed by ``id``; checkpoint 2 changes ``changed`` existing keys.

Both tables are compared with a pandas ground truth at the end of every round.

The step runs in the session a data-heavy step is advised to use (docs/operations.md): the full
JIT (:data:`JVM_OPTIONS`). With the default C1-only JIT, the JVM's conversion of the rows to
Arrow batches for the Python workers takes about three times as long and dominates the load.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from bench.inprocess import machine_facts, start_spark
from bench.measure import CpuMeter, elapsed, log, settle

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REPO = Path(__file__).resolve().parents[2]
CONN_ID = "bench_pg"
COLUMNS = "id bigint, label text, value double precision"
JVM_OPTIONS = "-XX:TieredStopAtLevel=4"
"""The full JIT (C1, then C2 for hot code) over the embedded default C1 only."""


def _rows(n: int, start: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    ids = np.arange(start, start + n, dtype=np.int64)
    return pd.DataFrame({"id": ids, "label": [f"label-{i}" for i in ids], "value": rng.random(n)})


def _floor(server: Any, schema: str, rows: pd.DataFrame) -> float:
    """Seconds of one psycopg ``COPY`` of ``rows`` (Arrow's CSV of the in-memory rows) into a logged table."""
    with server.connect() as db:
        db.execute(f"DROP TABLE IF EXISTS {schema}.floor")
        db.execute(f"CREATE TABLE {schema}.floor ({COLUMNS})")
        started = time.perf_counter()
        out = pa.BufferOutputStream()
        pacsv.write_csv(pa.Table.from_pandas(rows, preserve_index=False), out, pacsv.WriteOptions(include_header=False))
        with db.cursor() as cur, cur.copy(f"COPY {schema}.floor FROM STDIN (FORMAT csv)") as copy:
            copy.write(out.getvalue())
        seconds = elapsed(started)
        db.execute(f"DROP TABLE {schema}.floor")
    return seconds


def _table(server: Any, table: str) -> pd.DataFrame:
    with server.connect() as db:
        got = db.execute(f"SELECT id, label, value FROM {table} ORDER BY id").fetchall()
    return pd.DataFrame(got, columns=["id", "label", "value"])


def _later(mode: str, rows: int, changed: int, seed: int) -> pd.DataFrame:
    """Checkpoint 2: ``changed`` new ids (append), or ``changed`` existing ids drawn uniformly (upsert)."""
    later = _rows(changed, rows, seed + 1)
    if mode == "upsert":
        later["id"] = np.sort(np.random.default_rng(seed).choice(rows, changed, replace=False))
    return later


def _truth(mode: str, base: pd.DataFrame, later: pd.DataFrame) -> pd.DataFrame:
    kept = base[~base.id.isin(later.id)] if mode == "upsert" else base
    return pd.concat([kept, later]).sort_values("id").reset_index(drop=True)


def _round(spark: SparkSession, server: Any, n: int, rows: int, changed: int, seed: int) -> dict[str, Any]:
    """One round in schema ``r<n>``: floor, append and upsert sinks, floor again, ground truth."""
    from airflow_provider_checkpoint.dataflow import PostgresTableSink, Source
    from airflow_provider_checkpoint.storage import JobStorage

    sys.path.insert(0, str(REPO))
    from tests.spark.helpers import step_context  # the step context the Spark tests build

    schema, seed = f"r{n}", seed + 10 * n
    with server.connect() as db:
        db.execute(f"CREATE SCHEMA {schema}")
    base = _rows(rows, 0, seed)
    floors = [_floor(server, schema, base)]
    out: dict[str, Any] = {"round": n, "rows": rows, "changed": changed, "floor_s": floors, "problems": []}
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))  # as an aggregate's output arrives
    for mode in ("append", "upsert"):
        table = f"{schema}.{mode}_facts"
        sink = PostgresTableSink(mode, Source("src"), CONN_ID, table, mode, ["id"] if mode == "upsert" else None)
        storage = JobStorage.for_job(str(Path("/tmp/checkpoint-bench-pg") / schema), mode)  # the sink writes no files
        later = _later(mode, rows, changed, seed)
        for checkpoint_id, batch in ((1, base), (2, later)):
            df = spark.createDataFrame(batch).repartition(partitions).cache()
            df.count()
            ctx = step_context(spark, storage, checkpoint_id)
            started = time.perf_counter()
            sink.prepare(ctx)
            committables = sink.stage(ctx, df)
            step = elapsed(started)
            started = time.perf_counter()
            sink.commit(checkpoint_id, committables)
            commit = elapsed(started)
            out[f"{mode}_{checkpoint_id}"] = {"rows": len(batch), "step_s": step, "commit_s": commit}
            log(f"round {n} {mode} checkpoint {checkpoint_id}: {len(batch):,} rows, step {step:.2f}s, "
                f"commit {commit:.3f}s")  # fmt: skip
            df.unpersist()
            settle(spark)
        if not _table(server, table).astype(str).equals(_truth(mode, base, later).astype(str)):
            out["problems"].append(f"round {n}: {mode} table differs from the ground truth")
    floors.append(_floor(server, schema, base))
    log(f"round {n} floor: {floors[0]:.2f}s, {floors[1]:.2f}s for {rows:,} rows")
    return out


def _warm_up(spark: SparkSession, server: Any) -> None:
    """One tiny round: Python workers started and modules imported before anything is measured."""
    _round(spark, server, 0, 1000, 10, 0)


def run(rows: int, changed: int, rounds: int, work: Path, seed: int) -> dict[str, Any]:
    import os

    sys.path.insert(0, str(REPO))
    from tests.servers.postgres import start_server

    root = work / "postgres"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    (work / "run").mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    cpu_all = CpuMeter()
    server = start_server(root)
    try:
        os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = server.uri()
        spark, session_seconds = start_spark({"spark.driver.extraJavaOptions": JVM_OPTIONS})
        _warm_up(spark, server)
        results = [_round(spark, server, n, rows, changed, seed) for n in range(1, rounds + 1)]
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    return {
        "machine": machine_facts(spark, session_seconds),
        "jvm_options": JVM_OPTIONS,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "other_processes_cores": round(cpu_all.stop()[1], 2),
        "rounds": results,
        "problems": [p for r in results for p in r["problems"]],
    }


def render(result: dict[str, Any]) -> str:
    from bench.report import machine_lines

    rounds = result["rounds"]
    first = rounds[0]
    lines = [
        f"### PostgreSQL sink: step load vs the COPY floor, finalize ({first['rows']:,} rows, "
        f"{first['changed']:,} changed keys)",
        "",
        *machine_lines(result),
        "- Narrow rows `(id bigint, label text, value double precision)`, server from `tests/servers/postgres.py` "
        "(`fsync=off`); the step's input is cached in Spark in `spark.sql.shuffle.partitions` partitions; "
        f"the driver JVM runs with `{result['jvm_options']}` (full JIT, as docs/operations.md advises for "
        "data-heavy steps; the embedded default is C1 only).",
        "- **floor**: one psycopg `COPY` of the same rows from the driver (Arrow CSV of the in-memory rows, into a "
        "logged table like the staging table), measured before and after the sinks in the same round; the ratio "
        "uses the faster one.",
        "- **step**: `prepare` + `stage` of checkpoint 1 (claim, table check and creation, staging table, the "
        "executors' COPY, checks); **finalize**: `commit` of checkpoint 2 into the table of checkpoint 1.",
        "",
        "| round | floor rows/s | append step rows/s | ratio (target ≥ 0.7) | upsert step rows/s | ratio "
        "| append finalize s | upsert finalize s (target < 1) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rounds:
        floor = r["rows"] / min(r["floor_s"])
        append, upsert = r["rows"] / r["append_1"]["step_s"], r["rows"] / r["upsert_1"]["step_s"]
        lines.append(
            f"| {r['round']} | {floor:,.0f} | {append:,.0f} | {append / floor:.2f} | {upsert:,.0f} | "
            f"{upsert / floor:.2f} | {r['append_2']['commit_s']:.3f} | {r['upsert_2']['commit_s']:.3f} |"
        )
    lines += [
        "",
        f"Ground truth (pandas, every table, every round): "
        f"{'all match' if not result['problems'] else '; '.join(result['problems'])}.",
    ]
    return "\n".join(lines)
