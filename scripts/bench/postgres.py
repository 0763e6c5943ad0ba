"""PostgresTableSink: staging, verify and commit of a load against the physical floor, in one run.

Starts PostgreSQL the way the tests do (:func:`tests.servers.postgres.start_server`). Per round,
in a fresh schema, with narrow rows ``(id bigint, label text, value double precision)``:

- **floor**: one plain psycopg ``COPY`` of the same rows from the driver (Arrow-written CSV into
  a logged table, like the staging table), measured before and after the sinks' loads;
- **append**, **append-partitions** (``partition_per_checkpoint``): checkpoint 1 stages ``rows`` rows,
  finalize verifies and commits them (each phase timed); checkpoint 2 appends ``changed`` rows
  (finalize time into a ``rows``-row table);
- **upsert**: the same, keyed by ``id``; checkpoint 2 changes ``changed`` existing keys;
- each fed three ways (:data:`FEEDS`): a DataFrame whose row count the step knows (collected into the driver),
  the same DataFrame with its count unknown (the executors ``COPY`` it), the rows a source read on the driver.

Every table is compared with a pandas ground truth at the end of every round.

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
PGJDBC = Path("/usr/share/java/postgresql.jar")
"""Debian's pgjdbc (``libpostgresql-jdbc-java``, installed by ``bash scripts/install_pgjdbc.sh``): with it,
each round also times Spark's JDBC writer loading the same rows, for reference."""
JVM_OPTIONS = "-XX:TieredStopAtLevel=4"
"""The full JIT (C1, then C2 for hot code) over the embedded default C1 only."""


def _rows(n: int, start: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    ids = np.arange(start, start + n, dtype=np.int64)
    return pd.DataFrame({"id": ids, "label": [f"label-{i}" for i in ids], "value": rng.random(n)})


def _floor(server: Any, schema: str, rows: pd.DataFrame, form: str = "csv") -> float:
    """Seconds of one psycopg ``COPY`` of ``rows`` into a logged table, written from the in-memory rows by
    Arrow as CSV (``form="csv"``) or by pgpq in PostgreSQL's binary form (``form="binary"``)."""
    import pgpq

    with server.connect() as db:
        db.execute(f"DROP TABLE IF EXISTS {schema}.floor")
        db.execute(f"CREATE TABLE {schema}.floor ({COLUMNS})")
        started = time.perf_counter()
        table = pa.Table.from_pandas(rows, preserve_index=False)
        with db.cursor() as cur, cur.copy(f"COPY {schema}.floor FROM STDIN (FORMAT {form})") as copy:
            if form == "binary":
                encoder = pgpq.ArrowToPostgresBinaryEncoder(table.schema)
                copy.write(encoder.write_header())
                for batch in table.to_batches():
                    copy.write(encoder.write_batch(batch))
                copy.write(encoder.finish())
            else:
                out = pa.BufferOutputStream()
                pacsv.write_csv(table, out, pacsv.WriteOptions(include_header=False))
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


KINDS = {
    "append": {"mode": "append"},
    "append-partitions": {"mode": "append", "partition_per_checkpoint": True},
    "upsert": {"mode": "upsert", "keys": ["id"]},
}
"""The sinks loaded per round: append (the commit copies the staged rows with ``INSERT … SELECT``),
append with ``partition_per_checkpoint`` (the commit attaches them), upsert by ``id``."""
DRIVER, EXECUTORS = "-driver", "-executors"
FEEDS = ("", EXECUTORS, DRIVER)
"""How a sink's input arrives: ``<kind>``: a cached DataFrame whose row count the step knows (a stateful
operator's output, through Spark: collected into the driver, ``toArrow()``); ``<kind>-executors``: the same
DataFrame, its count unknown to the step (a stateless transform's output: Spark's executors ``COPY`` it);
``<kind>-driver``: the rows a source read on the driver (a Parquet ``FileSource`` or a CDC checkpoint feeding only
the sink)."""
SINKS = {f"{name}{feed}": options for feed in FEEDS for name, options in KINDS.items()}


def _load(
    sink: Any, spark: SparkSession, storage: Any, checkpoint_id: int, batch: pd.DataFrame, feed: str
) -> dict[str, Any]:
    """One checkpoint through the sink as a step and finalize run it: ``prepare`` + ``stage`` (the step),
    ``verify_staged`` (finalize, before ``_metadata``), ``commit``; seconds of each. The step has the rows as
    ``feed`` (:data:`FEEDS`) gives them: with :data:`DRIVER`, as a source read on the driver hands them
    (``stage`` of ``SourceRows``, ``df.toArrow()``, made before the clock starts)."""
    from airflow_provider_checkpoint.dataflow.driver_rows import SourceRows
    from tests.spark.helpers import step_context  # the step context the Spark tests build

    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))  # as an aggregate's output arrives
    df = spark.createDataFrame(batch).repartition(partitions).cache()
    df.count()
    ctx = step_context(spark, storage, checkpoint_id)
    if feed == "":  # as the step knows a stateful operator's output rows
        ctx.output_rows["src"] = len(batch)
    driver = feed == DRIVER
    started = time.perf_counter()
    read = SourceRows(df.toArrow(), df.schema, lambda: df) if driver else None
    to_arrow = elapsed(started)
    spark._jvm.System.gc()  # type: ignore[union-attr]  # not the previous load's garbage in this one's time
    started = time.perf_counter()
    sink.prepare(ctx)
    committables = sink.stage(ctx, df if read is None else read)
    figures = {"rows": len(batch), "stage_s": elapsed(started), **({"to_arrow_s": to_arrow} if driver else {})}
    started = time.perf_counter()
    sink.verify_staged(checkpoint_id, committables)
    figures["verify_s"] = elapsed(started)
    started = time.perf_counter()
    sink.commit(checkpoint_id, committables)
    figures["commit_s"] = elapsed(started)
    df.unpersist()
    settle(spark)
    return figures


def _round(spark: SparkSession, server: Any, n: int, rows: int, changed: int, seed: int) -> dict[str, Any]:
    """One round in schema ``r<n>``: floor, the :data:`SINKS`, floor again, ground truth."""
    from airflow_provider_checkpoint.dataflow import PostgresTableSink, Source
    from airflow_provider_checkpoint.storage import JobStorage

    sys.path.insert(0, str(REPO))
    schema, seed = f"r{n}", seed + 10 * n
    with server.connect() as db:
        db.execute(f"CREATE SCHEMA {schema}")
    base = _rows(rows, 0, seed)
    floors = [_floor(server, schema, base)]
    binary = [_floor(server, schema, base, "binary")]
    out: dict[str, Any] = {
        "round": n, "rows": rows, "changed": changed, "floor_s": floors, "binary_floor_s": binary, "problems": []
    }  # fmt: skip
    names = list(SINKS)
    for name in names[n % len(names) :] + names[: n % len(names)]:  # no sink always loads first
        options = SINKS[name]
        mode = str(options["mode"])
        table = f"{schema}.{name.replace('-', '_')}"
        sink = PostgresTableSink(name, Source("src"), CONN_ID, table, **options)
        storage = JobStorage.for_job(str(Path("/tmp/checkpoint-bench-pg") / schema), name)  # the sink writes no files
        later = _later(mode, rows, changed, seed)
        feed = next(f for f in FEEDS[1:] + FEEDS[:1] if name.endswith(f))
        for checkpoint_id, batch in ((1, base), (2, later)):
            figures = out[f"{name}_{checkpoint_id}"] = _load(sink, spark, storage, checkpoint_id, batch, feed)
            log(f"round {n} {name} checkpoint {checkpoint_id}: {len(batch):,} rows, step {figures['stage_s']:.2f}s, "
                f"verify {figures['verify_s']:.3f}s, commit {figures['commit_s']:.3f}s")  # fmt: skip
        if not _table(server, table).astype(str).equals(_truth(mode, base, later).astype(str)):
            out["problems"].append(f"round {n}: {name} table differs from the ground truth")
    if PGJDBC.exists():
        out["jdbc_s"] = _jdbc(spark, server, schema, base)
        log(f"round {n} JDBC writer: {out['jdbc_s']:.2f}s")
    floors.append(_floor(server, schema, base))
    binary.append(_floor(server, schema, base, "binary"))
    log(f"round {n} floor: CSV {floors[0]:.2f}s, {floors[1]:.2f}s, binary {binary[0]:.2f}s, {binary[1]:.2f}s")
    return out


def _jdbc(spark: SparkSession, server: Any, schema: str, rows: pd.DataFrame) -> float:
    """Seconds of Spark's JDBC writer (pgjdbc, batched ``INSERT`` rewritten to multi-row statements, one
    stream per core as the sink loads) of ``rows`` into a logged table."""
    from airflow_provider_checkpoint.connectors.postgres.load import one_stream_per_core
    from tests.servers.postgres import DATABASE, USER

    with server.connect() as db:
        db.execute(f"CREATE TABLE {schema}.jdbc ({COLUMNS})")
    df = spark.createDataFrame(rows).repartition(int(spark.conf.get("spark.sql.shuffle.partitions"))).cache()
    df.count()
    url = f"jdbc:postgresql://127.0.0.1:{server.port}/{DATABASE}"
    options = {"user": USER, "password": server.password, "driver": "org.postgresql.Driver"}
    started = time.perf_counter()
    one_stream_per_core(df).write.jdbc(
        url, f"{schema}.jdbc", "append", {**options, "batchsize": "10000", "reWriteBatchedInserts": "true"}
    )
    seconds = elapsed(started)
    df.unpersist()
    return seconds


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
    if not PGJDBC.exists():
        log("no pgjdbc: Spark's JDBC writer is left out (bash scripts/install_pgjdbc.sh adds it)")
    load_before = os.getloadavg()
    cpu_all = CpuMeter()
    server = start_server(root)
    try:
        os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = server.uri()
        conf = {
            "spark.driver.extraJavaOptions": JVM_OPTIONS,
            **({"spark.jars": str(PGJDBC)} if PGJDBC.exists() else {}),
        }
        spark, session_seconds = start_spark(conf)
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


def _whole(figures: dict[str, Any]) -> float:
    """Seconds of a checkpoint's whole load: staging, verify, commit."""
    return float(figures["stage_s"] + figures["verify_s"] + figures["commit_s"])


def _to_arrow(r: dict[str, Any]) -> float:
    """The fastest ``df.toArrow()`` of round ``r``'s cached rows (one per driver sink)."""
    return min(float(r[f"{name}_1"]["to_arrow_s"]) for name in SINKS if name.endswith(DRIVER))


def _summary(rounds: list[dict[str, Any]]) -> str:
    """Per sink fed a DataFrame, the range over the rounds of floor / whole and DataFrame floor / whole."""

    def span(values: list[float]) -> str:
        return f"{min(values):.2f}–{max(values):.2f}" if len(values) > 1 else f"{values[0]:.2f}"

    parts = []
    for name in (n for n in SINKS if not n.endswith(DRIVER)):
        wholes = [(r, _whole(r[f"{name}_1"])) for r in rounds]
        floor = [min(*r["floor_s"], *r["binary_floor_s"]) / whole for r, whole in wholes]
        frame = [(min(*r["floor_s"], *r["binary_floor_s"]) + _to_arrow(r)) / whole for r, whole in wholes]
        parts.append(f"{name} {span(floor)} ({span(frame)})")
    return "Fed a DataFrame, floor / whole (DataFrame floor / whole) over the rounds: " + "; ".join(parts) + "."


def render(result: dict[str, Any]) -> str:
    from bench.report import machine_lines

    rounds = result["rounds"]
    first = rounds[0]
    lines = [
        f"### PostgreSQL sink: the whole load (staging and commit) vs one COPY ({first['rows']:,} rows, "
        f"{first['changed']:,} changed keys)",
        "",
        *machine_lines(result),
        "- Narrow rows `(id bigint, label text, value double precision)`, server from `tests/servers/postgres.py` "
        "(`fsync=off`); the step's input is cached in Spark in `spark.sql.shuffle.partitions` partitions; "
        f"the driver JVM runs with `{result['jvm_options']}` (the full JIT, which the provider gives a step "
        "that reads at least 128 MiB; a smaller step starts with C1 alone, docs/operations.md).",
        "- **floor**: one psycopg `COPY` of the same rows from the driver into a logged table like the staging "
        "table, written from the in-memory rows as CSV (Arrow) and in binary form (pgpq, as the sink sends these "
        "column types), each measured before and after the sinks in the same round; **floor** is the fastest of "
        "the four, the ratios use it.",
        "- Checkpoint 1 loads the rows into a new table: **staging** = `prepare` + `stage` (claim, table check and "
        "creation, staging table, the collect or the executors' COPY, checks), **verify** = finalize's check of the "
        "staging table before `_metadata` (its seal, a catalog look-up), **commit** = the commit transaction; "
        "**whole** = the three; "
        "**later commit**: checkpoint 2's commit into the table of checkpoint 1.",
        "- Sinks: `append` (the commit copies the staged rows, `INSERT … SELECT`), `append-partitions` "
        "(`partition_per_checkpoint=True`: the commit attaches them), `upsert` by `id`; each fed by the cached "
        "DataFrame with its row count known to the step (a stateful operator's output: at most `driver_rows`, "
        "Spark's estimate at most `driver_bytes`, so it is collected with one `toArrow()` in the clock and the "
        "driver reduces and `COPY`s it), as `<sink>-executors` by the same DataFrame with its count unknown (a "
        "stateless transform's output: Spark's executors `COPY` it, as every DataFrame before), and as "
        "`<sink>-driver` by the same rows held on the driver as a source that read them there hands them (a "
        "Parquet `FileSource` or a CDC checkpoint feeding only the sink; `df.toArrow()` before the clock starts): "
        "the driver reduces and `COPY`s them, no Spark job.",
        "- **DataFrame floor** (sinks fed by a DataFrame): `df.toArrow()` of the same cached rows (the fastest of "
        "the round's three) + the floor: what any load out of a Spark DataFrame pays at least, rows leaving the "
        "JVM before one `COPY` sends them.",
        "",
        "| round | sink | CSV COPY s | binary COPY s | staging s | verify s | commit s | whole s "
        "| floor / whole (target ≥ 0.6) | DataFrame floor / whole | floor / staging | later commit s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rounds:
        floor = min(*r["floor_s"], *r["binary_floor_s"])
        frame_floor = floor + _to_arrow(r)
        for name in SINKS:
            one, later = r[f"{name}_1"], r[f"{name}_2"]
            whole = _whole(one)
            frame = "" if name.endswith(DRIVER) else f"{frame_floor / whole:.2f}"
            lines.append(
                f"| {r['round']} | {name} | {min(r['floor_s']):.2f} | {min(r['binary_floor_s']):.2f} | "
                f"{one['stage_s']:.2f} | {one['verify_s']:.2f} | "
                f"{one['commit_s']:.2f} | {whole:.2f} | {floor / whole:.2f} | {frame} | {floor / one['stage_s']:.2f} | "
                f"{later['commit_s']:.3f} |"
            )
    to_arrow = [f"{r[f'{name}_1']['to_arrow_s']:.2f}" for r in rounds for name in SINKS if name.endswith(DRIVER)]
    lines += ["", _summary(rounds)]
    lines += [
        "",
        "`df.toArrow()` of the cached DataFrame (its rows brought to the driver: what a step through Spark would pay "
        f"before a load from the driver), per round and driver sink: {', '.join(to_arrow)} s.",
    ]
    jdbc = [r for r in rounds if "jdbc_s" in r]
    if jdbc:
        ratios = "; ".join(
            f"round {r['round']}: {r['jdbc_s']:.2f} s, "
            + ", ".join(f"{name} {r['jdbc_s'] / _whole(r[f'{name}_1']):.2f}" for name in KINDS)
            for r in jdbc
        )
        lines += [
            "",
            "Spark's JDBC writer (Debian's pgjdbc, `batchsize=10000`, `reWriteBatchedInserts=true`, one stream per "
            "core) loading the same rows into a plain table, and its time ÷ our whole load through Spark: "
            f"{ratios}.",
        ]
    lines += [
        "",
        f"Ground truth (pandas, every table, every round): "
        f"{'all match' if not result['problems'] else '; '.join(result['problems'])}.",
    ]
    return "\n".join(lines)
