"""PostgresCdcSource against its floors, side by side in one run, on the tests' PostgreSQL server.

Starts PostgreSQL the way the tests do (:func:`tests.servers.postgres.start_server`, ``wal_level=logical``).
Rows are narrow: ``(id bigint primary key, label text, value double precision)``. Per round:

- **stream**: a table of ``rows`` rows; an in-process job (``PostgresCdcSource`` → ``DeltaTableSink``
  upsert by ``id``, ``delete_when="deleted"``) takes its snapshot (checkpoint 1); then ``changes`` row
  changes (half updates, 30 % inserts, 20 % deletes, 1,000 per transaction) are committed, and three
  readers go over the same WAL: the **floor**, one plain reader (``pg_logical_slot_peek_binary_changes``
  of a second pgoutput slot created with the first checkpoint, messages counted in Python, nothing
  decoded), the source's **decode** alone (peek, pgoutput decode, Arrow), and **checkpoint 2** as users
  run it (trigger, the step reading the slot and upserting into Delta from the driver, finalize), and
  checkpoint 2 of a second job on its own slot forced through Spark (``driver_read_bytes=0``), the two
  in alternating order. Each Delta table (read by delta-rs) is compared with a ``SELECT`` of the source table.
  Then the floor again (what the order costs it) and the server's decoding alone (the floor's peek counted on
  the server: what the floor's client adds).
- **snapshot**: a table of ``snapshot_rows`` rows; the source's first barrier (slot with an exported
  snapshot, every row read under it, Parquet into the job's storage) vs one ``COPY table TO STDOUT``
  read by psycopg (bytes counted), the floor of reading the table at all; and the chunked snapshot
  (``snapshot_chunk_rows`` = a tenth of the table): its barriers one after another until the last chunk
  (the trigger side of ten checkpoints; the steps' Spark work is the same rows either way).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.inprocess import machine_facts, start_spark
from bench.measure import elapsed, log

REPO = Path(__file__).resolve().parents[2]
CONN_ID = "bench_cdc"
DDL = "CREATE TABLE {t} (id bigint PRIMARY KEY, label text, value double precision)"
FILL = "INSERT INTO {t} SELECT i, 'label-' || i, random() FROM generate_series({a}, {b}) AS i"
BATCH = 1000
"""Row changes per transaction in the stream part."""


def _fill(db: Any, table: str, rows: int) -> None:
    db.execute(DDL.format(t=table))
    db.execute(FILL.format(t=table, a=0, b=rows - 1))
    db.execute(f"VACUUM ANALYZE {table}")


def _changes(db: Any, table: str, rows: int, changes: int) -> int:
    """``changes`` row changes in transactions of :data:`BATCH`: updates of ids from 0 up, inserts of new
    ids from ``rows`` up, deletes of ids from the top of the original range down; the changes made."""
    made, upd, ins, dele = 0, 0, rows, rows - 1
    while made < changes:
        u, i, d = BATCH // 2, BATCH * 3 // 10, BATCH // 5
        with db.transaction():
            db.execute(
                f"UPDATE {table} SET value = value + 1, label = label || 'u' WHERE id BETWEEN %s AND %s",
                (upd, upd + u - 1),
            )
            db.execute(FILL.format(t=table, a=ins, b=ins + i - 1))
            db.execute(f"DELETE FROM {table} WHERE id BETWEEN %s AND %s", (dele - d + 1, dele))
        made, upd, ins, dele = made + u + i + d, upd + u, ins + i, dele - d
    return made


def _floor(db: Any, slot: str, publication: str) -> tuple[float, int, int]:
    """Seconds, messages and bytes of one plain read of the slot (peeked, pgoutput, nothing decoded)."""
    started, count, size = time.perf_counter(), 0, 0
    with db.transaction(), db.cursor(name="floor") as cursor:
        cursor.itersize = 5000
        cursor.execute(
            "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', '1', "
            "'publication_names', %s)",
            (slot, publication),
        )
        for (data,) in cursor:
            count, size = count + 1, size + len(data)
    return elapsed(started), count, size


def _bare_floor(db: Any, slot: str, publication: str) -> float:
    """Seconds of the server's decoding alone: the floor's peek counted on the server, no message sent."""
    started = time.perf_counter()
    with db.transaction():
        db.execute(
            "SELECT count(*) FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', '1', "
            "'publication_names', %s)",
            (slot, publication),
        ).fetchone()
    return elapsed(started)


def _check(db: Any, table: str, delta: Path) -> list[str]:
    import pyarrow as pa
    from deltalake import DeltaTable

    want = sorted(db.execute(f"SELECT id, label, value FROM {table}").fetchall())
    got = pa.table(DeltaTable(str(delta)).scan()).select(["id", "label", "value"]).to_pylist()  # DVs applied
    got_rows = sorted((r["id"], r["label"], r["value"]) for r in got)
    return (
        []
        if got_rows == want
        else [f"{table}: Delta has {len(got_rows)} rows, the source {len(want)} (or values differ)"]
    )


def _stream(server: Any, spark: Any, work: Path, r: int, rows: int, changes: int) -> dict[str, Any]:
    from airflow_provider_checkpoint.connectors.delta.sink import DeltaTableSink
    from airflow_provider_checkpoint.connectors.postgres.cdc import PostgresCdcSource
    from airflow_provider_checkpoint.connectors.postgres.cdc_driver import DRIVER_READ_BYTES
    from airflow_provider_checkpoint.connectors.postgres.pgoutput import lsn_to_int
    from airflow_provider_checkpoint.testing.inprocess import make_job

    table, slot, floor_slot = f"stream_{r}", f"bench_cdc_{r}", f"bench_floor_{r}"
    tmp = work / f"stream-{r}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with server.connect() as db:
        _fill(db, table, rows)

    def declare(slot: str, driver_read_bytes: int) -> Callable[[Path], None]:
        def graph(root: Path) -> None:
            source = PostgresCdcSource(
                "rows", [table], postgres_conn_id=CONN_ID, slot_name=slot, driver_read_bytes=driver_read_bytes
            )
            DeltaTableSink("lake", source, str(root / "delta"), "upsert", ["id"], delete_when="deleted")

        return graph

    # the source's rows to the sink from the driver (as users run it), and through Spark (driver_read_bytes=0)
    jobs = {
        "driver": make_job(spark, tmp / "driver", declare(slot, DRIVER_READ_BYTES), retained_checkpoints=1),
        "spark": make_job(spark, tmp / "spark", declare(f"{slot}_spark", 0), retained_checkpoints=1),
    }
    firsts = {name: job.checkpoint() for name, job in jobs.items()}
    first = firsts["driver"]
    with server.connect() as db:
        db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (floor_slot,))
        made = _changes(db, table, rows, changes)
        floor = _floor(db, floor_slot, slot)
        source = jobs["driver"].graph.nodes["rows"]
        start = lsn_to_int(first.source_positions["rows"]["lsn"])
        (end,) = db.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
        started = time.perf_counter()
        position = first.source_positions["rows"]
        (decoded,) = source._changes(slot, slot, position, (start, lsn_to_int(end) + 1))
        decode = elapsed(started)
        seconds, problems = {}, []
        for name in sorted(jobs, reverse=r % 2 == 1):  # alternate which goes first
            started = time.perf_counter()
            second = jobs[name].checkpoint()
            seconds[name] = elapsed(started)
            problems += _check(db, table, tmp / name / "delta")
            if second.stats["records_in"] != made:
                problems.append(f"{name}: {made} changes made, {second.stats['records_in']} read")
        if decoded.num_rows != made:
            problems.append(f"{made} changes made, {decoded.num_rows} decoded")
        again, bare = _floor(db, floor_slot, slot)[0], _bare_floor(db, floor_slot, slot)  # after: the order's share
        for name in (slot, f"{slot}_spark", floor_slot):
            db.execute("SELECT pg_drop_replication_slot(%s)", (name,))
        db.execute(f"DROP TABLE {table}; DROP PUBLICATION {slot}; DROP PUBLICATION {slot}_spark")
    shutil.rmtree(tmp, ignore_errors=True)
    log(
        f"stream round {r}: floor {floor[0]:.1f}s, decode {decode:.1f}s, checkpoint {seconds['driver']:.1f}s "
        f"(through Spark {seconds['spark']:.1f}s)"
    )
    return {
        "changes": made,
        "messages": floor[1],
        "wal_bytes": floor[2],
        "floor_s": floor[0],
        "floor_again_s": again,
        "bare_floor_s": bare,
        "decode_s": decode,
        "checkpoint_s": seconds["driver"],
        "spark_checkpoint_s": seconds["spark"],
        "phases": jobs["driver"].timings[-1],
        "spark_phases": jobs["spark"].timings[-1],
        "snapshot_checkpoint_s": sum(jobs["driver"].timings[0].values()),
        "problems": problems,
    }


def _snapshot(server: Any, work: Path, r: int, table: str) -> dict[str, Any]:
    from airflow_provider_checkpoint.connectors.postgres.cdc import PostgresCdcSource
    from airflow_provider_checkpoint.storage import JobStorage

    with server.connect() as db:
        started, size = time.perf_counter(), 0
        with db.cursor().copy(f"COPY {table} TO STDOUT") as copy:
            for chunk in copy:
                size += len(chunk)
        copy_s = elapsed(started)
    slot = f"bench_snap_{r}"
    root = work / f"snapshot-{r}"
    shutil.rmtree(root, ignore_errors=True)
    source = PostgresCdcSource("rows", [table], postgres_conn_id=CONN_ID, slot_name=slot)
    source.bind_storage(JobStorage.for_job(f"file://{root}", "snap"))
    started = time.perf_counter()
    position = source.barrier_position(None)
    ours = elapsed(started)
    files = sum(p.stat().st_size for p in root.rglob("*.parquet"))
    with server.connect() as db:
        db.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        db.execute(f"DROP PUBLICATION {slot}")
    shutil.rmtree(root, ignore_errors=True)
    log(f"snapshot round {r}: COPY {copy_s:.1f}s, ours {ours:.1f}s")
    return {
        "copy_s": copy_s,
        "copy_bytes": size,
        "snapshot_s": ours,
        "parquet_bytes": files,
        "files": len(position["snapshot"]),
    }


def _chunked(server: Any, work: Path, r: int, table: str, chunk_rows: int) -> dict[str, Any]:
    """The chunked snapshot's barriers (``snapshot_chunk_rows``), one after another until the cursor is done:
    the trigger side of as many checkpoints (each chunk read under its own snapshot, rows to Parquet)."""
    from airflow_provider_checkpoint.connectors.postgres.cdc import PostgresCdcSource
    from airflow_provider_checkpoint.storage import JobStorage

    slot, root = f"bench_chunk_{r}", work / f"chunked-{r}"
    shutil.rmtree(root, ignore_errors=True)
    source = PostgresCdcSource(
        "rows", [table], postgres_conn_id=CONN_ID, slot_name=slot, snapshot_chunk_rows=chunk_rows
    )
    source.bind_storage(JobStorage.for_job(f"file://{root}", "chunked"))
    started, chunks, rows, position = time.perf_counter(), [], 0, None
    while position is None or position.get("snapshot_cursor") is not None:
        begun = time.perf_counter()
        position = source.barrier_position(position)
        chunks.append(elapsed(begun))
        rows += position["chunk"]["rows"]
    ours = elapsed(started)
    with server.connect() as db:
        db.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        db.execute(f"DROP PUBLICATION {slot}")
    shutil.rmtree(root, ignore_errors=True)
    log(f"chunked round {r}: {len(chunks)} chunks of {chunk_rows:,}, {ours:.1f}s, longest {max(chunks):.2f}s")
    return {"chunked_s": ours, "chunks": len(chunks), "longest_chunk_s": max(chunks), "rows": rows}


def run(rows: int, changes: int, snapshot_rows: int, rounds: int, work: Path) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    from tests.servers.postgres import start_server

    work.mkdir(parents=True, exist_ok=True)
    (work / "run").mkdir(exist_ok=True)
    shutil.rmtree(work / "pg", ignore_errors=True)
    (work / "pg").mkdir()
    server = start_server(work / "pg")
    os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = server.uri()
    load_before = os.getloadavg()
    spark, session_s = start_spark({"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=4"})
    facts = machine_facts(spark, session_s)
    try:
        stream = [_stream(server, spark, work, r, rows, changes) for r in range(rounds)] if changes else []
        snapshots = []
        if snapshot_rows:
            with server.connect() as db:
                _fill(db, "snap", snapshot_rows)
            snapshots = [
                {**_snapshot(server, work, r, "snap"), **_chunked(server, work, r, "snap", snapshot_rows // 10)}
                for r in range(rounds)
            ]
    finally:
        spark.stop()
        server.stop()
        shutil.rmtree(work / "pg", ignore_errors=True)
    problems = [p for s in stream for p in s["problems"]]
    return {
        "machine": facts,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "rows": rows,
        "snapshot_rows": snapshot_rows,
        "stream": stream,
        "snapshot": snapshots,
        "problems": problems,
    }


def _median(values: list[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    return ordered[len(ordered) // 2], ordered[0], ordered[-1]


def _fmt(values: list[float], unit: str = "", digits: int = 2) -> str:
    mid, low, high = _median(values)
    return f"{mid:,.{digits}f}{unit} ({low:,.{digits}f}–{high:,.{digits}f})"


def render(result: dict[str, Any]) -> str:
    load = ", ".join(f"{a:.1f}/{b:.1f}" for a, b in zip(result["load_before"], result["load_after"], strict=True))
    lines = [
        "## CDC: PostgresCdcSource vs a plain slot reader and COPY",
        "",
        f"Load average (1/5/15 min, before/after): {load}; {result['machine'].get('nproc', '?')} cores. "
        "Median (min–max) of the rounds; each round measures ours and its floor side by side.",
        "",
    ]
    stream = result["stream"]
    if stream:
        n = stream[0]["changes"]
        floor = [s["changes"] / s["floor_s"] for s in stream]
        decode = [s["changes"] / s["decode_s"] for s in stream]
        ckpt = [s["changes"] / s["checkpoint_s"] for s in stream]
        through = [s["changes"] / s["spark_checkpoint_s"] for s in stream]
        lines += [
            f"**Stream**: {n:,} row changes (50 % updates, 30 % inserts, 20 % deletes; {BATCH:,} per transaction) "
            f"into a Delta upsert table of {result['rows']:,} rows, {len(stream)} rounds.",
            "",
            "| reader | changes/s | vs the floor |",
            "|---|---:|---:|",
            f"| floor: one plain reader of a second slot (peek, messages counted) | {_fmt(floor, '', 0)} | 1 |",
            f"| the source's read alone (peek, pgoutput decode, Arrow) | {_fmt(decode, '', 0)} | "
            f"{_fmt([d / f for d, f in zip(decode, floor, strict=True)])} |",
            f"| checkpoint 2 as users run it (trigger, step: read + Delta upsert from the driver, finalize) | "
            f"{_fmt(ckpt, '', 0)} | {_fmt([c / f for c, f in zip(ckpt, floor, strict=True)])} |",
            f"| checkpoint 2 through Spark (`driver_read_bytes=0`: createDataFrame, Spark's reduction) | "
            f"{_fmt(through, '', 0)} | {_fmt([c / f for c, f in zip(through, floor, strict=True)])} |",
            "",
            "The floor read again after the checkpoints: "
            f"{_fmt([s['changes'] / s.get('floor_again_s', s['floor_s']) for s in stream], '', 0)} changes/s; the "
            "server's decoding alone (the same peek counted on the server, no message sent): "
            f"{_fmt([s['changes'] / s.get('bare_floor_s', s['floor_s']) for s in stream], '', 0)} changes/s.",
            "",
            f"WAL read: {stream[0]['messages']:,} pgoutput messages, {stream[0]['wal_bytes'] / 1e6:,.0f} MB. "
            "Checkpoint 2's phases (s, first round): "
            + ", ".join(f"{k} {v:.1f}" for k, v in stream[0]["phases"].items())
            + "; through Spark: "
            + ", ".join(f"{k} {v:.1f}" for k, v in stream[0]["spark_phases"].items())
            + ".",
            "",
        ]
    snaps = result["snapshot"]
    if snaps:
        copy = [s["copy_s"] for s in snaps]
        ours = [s["snapshot_s"] for s in snaps]
        chunked = [s["chunked_s"] for s in snaps]
        rows = result["snapshot_rows"]
        lines += [
            f"**Snapshot** of a {rows:,}-row table, {len(snaps)} rounds:",
            "",
            "| reader | seconds | rows/s | vs COPY |",
            "|---|---:|---:|---:|",
            f"| one `COPY table TO STDOUT` read by psycopg | {_fmt(copy, '', 1)} | "
            f"{_fmt([rows / c for c in copy], '', 0)} | 1 |",
            f"| the source's first barrier (slot + exported snapshot, rows to Parquet) | {_fmt(ours, '', 1)} | "
            f"{_fmt([rows / o for o in ours], '', 0)} | {_fmt([c / o for c, o in zip(copy, ours, strict=True)])} |",
            f"| chunked (`snapshot_chunk_rows={rows // 10:,}`): {snaps[0]['chunks']} barriers, each a chunk under "
            f"its own snapshot to Parquet (longest {_fmt([s['longest_chunk_s'] for s in snaps], '', 2)} s) | "
            f"{_fmt(chunked, '', 1)} | {_fmt([rows / c for c in chunked], '', 0)} | "
            f"{_fmt([c / o for c, o in zip(copy, chunked, strict=True)])} |",
            "",
        ]
    return "\n".join(lines)
