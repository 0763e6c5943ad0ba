"""The chunked, resumable initial snapshot of PostgresCdcSource (``snapshot_chunk_rows``), against the real
server while a writer thread commits random transactions (inserts, updates that move a row to another primary
key, deletes; some with pauses inside) before, between and during every chunk read.

The oracle never goes through our decoder: the writer records each transaction's id
(``pg_current_xact_id()``) and what it did; the server's own WAL (``pg_walinspect``) gives each commit's LSN;
the checkpoint's recorded chunk snapshot (``pg_current_snapshot()`` text) says which transactions it sees. From
these, after every checkpoint, the model computes the Delta table (read with delta-rs) row by row: keys of
finished chunks and keys changed before the barrier as the source was at the barrier; keys of the checkpoint's
own chunk as its snapshot saw them, plus what committed before the barrier; a PostgreSQL upsert target (read
with psycopg) fed by the same source holds the same rows. Tables span several chunks and
checkpoints; a step fails and is retried; a checkpoint is aborted mid-snapshot (its chunk is read again);
the job is restored to a checkpoint taken mid-snapshot. ``CDC_CHUNK_SEEDS=n`` runs n more (larger) seeds.
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from airflow_provider_checkpoint.connectors.postgres.cdc import PostgresCdcSource
from airflow_provider_checkpoint.connectors.postgres.pgoutput import lsn_to_int
from airflow_provider_checkpoint.dataflow import DeltaTableSink, PostgresTableSink
from airflow_provider_checkpoint.exceptions import CdcSourceError, CheckpointAborted
from airflow_provider_checkpoint.restore.requests import request_restore
from airflow_provider_checkpoint.testing.inprocess import make_job
from tests.servers.postgres import PostgresServer, cdc_connection

pytestmark = pytest.mark.spark
Key = tuple[int, str]
Effect = tuple[str, Key | None, tuple[int, str, int] | None]
"""(table, old key or None, new row or None)."""


@pytest.fixture
def pg(postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[PostgresServer]:
    with cdc_connection(postgres_server, monkeypatch, "cdc_chunk_") as server:
        with server.connect() as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        yield server


def _key(rng: random.Random) -> Key:
    return rng.randrange(60), "".join(rng.choice("abc") for _ in range(2))  # lowercase: PG's order is Python's


@dataclass
class Writer:
    """Random transactions on its own connection, in a thread; the only writer, so ``rows`` is the source."""

    server: PostgresServer
    tables: list[str]
    seed: int
    rows: dict[str, dict[Key, int]] = field(default_factory=dict)
    txns: list[tuple[int, list[Effect]]] = field(default_factory=list)
    """(64-bit transaction id, effects) of every committed transaction, appended under ``lock`` at commit."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.rows = {t: {} for t in self.tables}

    def fill(self, n: int) -> None:
        """Rows before the job (the snapshot's), not recorded as transactions."""
        with self.server.connect() as conn:
            for table in self.tables:
                while len(self.rows[table]) < n:
                    key, v = _key(self.rng), self.rng.randrange(1000)
                    if key not in self.rows[table]:
                        conn.execute(f"INSERT INTO {table} VALUES (%s, %s, %s)", (*key, v))
                        self.rows[table][key] = v

    def one(self, conn: Any) -> None:
        effects: list[Effect] = []
        with self.lock, conn.transaction():
            (xid,) = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
            for _ in range(self.rng.choice([1, 1, 2, 4])):
                table = self.rng.choice(self.tables)
                rows, new = self.rows[table], _key(self.rng)
                op = self.rng.choice(["insert", "update", "move", "delete"]) if rows else "insert"
                old = self.rng.choice(sorted(rows)) if rows else None
                v = self.rng.randrange(1000)
                if op == "insert" and new not in rows:
                    conn.execute(f"INSERT INTO {table} VALUES (%s, %s, %s)", (*new, v))
                    rows[new] = v
                    effects.append((table, None, (*new, v)))
                elif op == "update" and old:
                    conn.execute(f"UPDATE {table} SET v = %s WHERE a = %s AND b = %s", (v, *old))
                    rows[old] = v
                    effects.append((table, old, (*old, v)))
                elif op == "move" and old and new not in rows:  # the primary key changes
                    conn.execute(f"UPDATE {table} SET a = %s, b = %s, v = %s WHERE a = %s AND b = %s", (*new, v, *old))
                    del rows[old]
                    rows[new] = v
                    effects.append((table, old, (*new, v)))
                elif op == "delete" and old:
                    conn.execute(f"DELETE FROM {table} WHERE a = %s AND b = %s", old)
                    del rows[old]
                    effects.append((table, old, None))
                if self.rng.random() < 0.2:
                    time.sleep(0.01)  # open across more of the trigger
            self.txns.append((int(xid), effects))  # committed when the block ends, before the lock is released

    def run(self) -> None:
        with self.server.connect() as conn:
            while not self.stop.is_set():
                self.one(conn)
                time.sleep(0.002)


@dataclass(frozen=True)
class Model:
    """What the target must hold after a checkpoint (see the module docstring)."""

    initial: dict[str, dict[Key, int]]
    order: list[str]

    def covered(self, cursor: Any, table: str, key: Key) -> bool:
        """Whether a snapshot cursor (``None``: finished) is past ``key``."""
        if cursor is None:
            return True
        at = self.order.index(cursor["table"])
        here = self.order.index(table)
        if here != at:
            return here < at
        return cursor["after"] is not None and key <= (int(cursor["after"][0]), cursor["after"][1])

    def expected(
        self,
        writer: Writer,
        commits: Callable[[], dict[int, int]],
        barrier: int,
        before: Any,
        after: Any,
        snapshot: str | None,
    ) -> dict[str, dict[Key, int]]:
        with writer.lock:  # no transaction commits meanwhile: every one recorded is in ``commits``
            lsns = commits()
            # a transaction that changed nothing commits without waiting for its flush; it matters to no row
            txns = sorted(((lsns[x & 0xFFFFFFFF], x, e) for x, e in writer.txns if e), key=lambda t: t[0])
        xmin, xmax, xip = (snapshot or "0:0:").split(":")
        running = {int(x) for x in xip.split(",") if x}

        def seen(xid: int) -> bool:
            return xid < int(xmin) or (xid < int(xmax) and xid not in running)

        def state(keep: Any) -> tuple[dict[str, dict[Key, int]], dict[str, set[Key]]]:
            rows = {t: dict(r) for t, r in self.initial.items()}
            touched: dict[str, set[Key]] = {t: set() for t in rows}
            for lsn, xid, effects in txns:
                if keep(lsn, xid):
                    for table, old, new in effects:
                        if old is not None:
                            rows[table].pop(old, None)
                            touched[table].add(old)
                        if new is not None:
                            rows[table][new[:2]] = new[2]
                            touched[table].add(new[:2])
            return rows, touched

        at_barrier, touched = state(lambda lsn, _: lsn < barrier)
        in_chunk, _ = state(lambda lsn, xid: lsn < barrier or (snapshot is not None and seen(xid)))
        chunk_saw, _ = state(lambda _, xid: snapshot is not None and seen(xid))
        out: dict[str, dict[Key, int]] = {t: {} for t in self.order}
        for table in self.order:
            keys = set(at_barrier[table]) | set(in_chunk[table]) | set(self.initial[table])
            for key in keys:
                if not self.covered(before, table, key) and self.covered(after, table, key):  # this chunk's
                    value = (
                        in_chunk[table].get(key)
                        if key in chunk_saw[table]
                        else (at_barrier[table].get(key) if key in touched[table] else None)
                    )
                elif self.covered(before, table, key) or key in touched[table]:
                    value = at_barrier[table].get(key)
                else:
                    value = None
                if value is not None:
                    out[table][key] = value
        return out


def commit_lsns(server: PostgresServer, since: int) -> dict[int, int]:
    """Transaction id (32 bits) → its commit record's LSN, from the server's WAL (pg_walinspect)."""
    with server.connect() as conn:  # a commit that wrote WAL waits for its flush, and so for every one before it
        conn.execute("SELECT pg_logical_emit_message(true, 'cdc-chunk-model', 'flush')")
        rows = conn.execute(
            "SELECT xid::text::bigint, start_lsn::text "
            "FROM pg_get_wal_records_info(%s::pg_lsn, pg_current_wal_flush_lsn()) "
            "WHERE resource_manager = 'Transaction' AND record_type LIKE 'COMMIT%%'",
            (f"{since >> 32:X}/{since & 0xFFFFFFFF:X}",),
        ).fetchall()
    return {int(x): lsn_to_int(lsn) for x, lsn in rows}


def target(path: Path, order: list[str]) -> dict[str, dict[Key, int]]:
    out: dict[str, dict[Key, int]] = {t: {} for t in order}
    if not path.exists():
        return out
    rows = pa.table(DeltaTable(str(path)).scan()).select(["source_table", "a", "b", "v"]).to_pylist()
    for r in rows:
        out[r["source_table"]][(r["a"], r["b"])] = r["v"]
    assert sum(len(t) for t in out.values()) == len(rows), "one row per key"
    return out


def pg_target(server: PostgresServer, table: str, order: list[str]) -> dict[str, dict[Key, int]]:
    """The PostgreSQL upsert target's rows (psycopg), as :func:`target` gives the Delta table's."""
    out: dict[str, dict[Key, int]] = {t: {} for t in order}
    with server.connect() as conn:
        if conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0] is None:
            return out
        rows = conn.execute(f"SELECT source_table, a, b, v FROM {table}").fetchall()
    for source_table, a, b, v in rows:
        out[source_table][(a, b)] = v
    assert sum(len(t) for t in out.values()) == len(rows), "one row per key"
    return out


def diff(found: dict[str, dict[Key, int]], expected: dict[str, dict[Key, int]]) -> dict[str, Any]:
    """Per table: keys missing from the target, keys it should not hold, keys with another value."""
    out = {}
    for table, want in expected.items():
        got = found[table]
        out[table] = {
            "missing": sorted(set(want) - set(got)),
            "extra": sorted(set(got) - set(want)),
            "wrong": sorted((k, got[k], want[k]) for k in set(got) & set(want) if got[k] != want[k]),
        }
    return out


def scenario(spark: Any, server: PostgresServer, tmp: Path, seed: int, rows: int, chunk: int) -> int:
    """The whole scenario for one seed; the number of checkpoints it ran."""
    n = uuid.uuid4().hex[:6]
    names = [f"cdc_chunk_{n}_a", f"cdc_chunk_{n}_b"]
    with server.connect() as conn:
        conn.execute(f"CREATE TABLE {names[0]} (a int, b text, v int, PRIMARY KEY (a, b))")
        conn.execute(f"CREATE TABLE {names[1]} (a int, b text, v int, PRIMARY KEY (a, b))")
        conn.execute(f"ALTER TABLE {names[1]} REPLICA IDENTITY FULL")  # key moves come as 'O', not 'K'
    order = [f"public.{t}" for t in names]
    writer = Writer(server, names, seed)
    writer.fill(rows)
    model = Model({f"public.{t}": dict(r) for t, r in writer.rows.items()}, order)
    writer.rows = {f"public.{t}": r for t, r in writer.rows.items()}
    writer.tables = order

    def declare(tmp: Path) -> None:
        changes = PostgresCdcSource(
            "src", names, postgres_conn_id="cdc_pg", slot_name=f"cdc_chunk_{n}", snapshot_chunk_rows=chunk
        )
        DeltaTableSink(
            "lake", changes, str(tmp / "lake"), mode="upsert", keys=["source_table", "a", "b"], delete_when="deleted"
        )
        PostgresTableSink(
            f"copy_{n}", changes, "cdc_pg", f"cdc_chunk_{n}_copy", mode="upsert", keys=["source_table", "a", "b"],
            delete_when="deleted", undo_checkpoints=10,
        )  # fmt: skip

    job = make_job(spark, tmp, declare, retained_checkpoints=10)
    cursors: dict[int, Any] = {0: {"table": order[0], "after": None}}
    thread = threading.Thread(target=writer.run, daemon=True)
    checkpoints, last = 0, 0
    with server.connect() as conn:  # a WAL record boundary before every transaction of the writer
        (start,) = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()

    def check(completed: Any, previous: int) -> None:
        position = completed.source_positions["src"]
        cursors[completed.checkpoint_id] = position.get("snapshot_cursor")
        chunk = position.get("chunk")
        expected = model.expected(
            writer,
            lambda: commit_lsns(server, lsn_to_int(start)),
            lsn_to_int(position["lsn"]),
            cursors[previous],
            cursors[completed.checkpoint_id],
            chunk and chunk["snapshot"],
        )
        found = target(tmp / "lake", order)
        assert found == expected, (completed.checkpoint_id, diff(found, expected), position)
        copied = pg_target(server, f"cdc_chunk_{n}_copy", order)
        assert copied == expected, ("PostgreSQL", completed.checkpoint_id, diff(copied, expected), position)

    try:
        while checkpoints < 40:
            checkpoints += 1
            if checkpoints == 3:  # a step fails once and is retried
                os.environ["CHECKPOINT_FAULTS"] = f"step.before_ack:checkpoint={checkpoints}:attempt=1"
            if checkpoints == 4:  # a step fails for good: the checkpoint aborts; the next reads its chunk again
                os.environ["CHECKPOINT_FAULTS"] = f"step.before_ack:checkpoint={checkpoints}"
                with pytest.raises(CheckpointAborted):
                    job.checkpoint()
                os.environ.pop("CHECKPOINT_FAULTS")
                continue
            completed = job.checkpoint()
            os.environ.pop("CHECKPOINT_FAULTS", None)
            check(completed, last)
            last = completed.checkpoint_id
            if checkpoints == 1:  # every writer transaction commits after the slot's consistent point
                thread.start()
            if checkpoints == 5:  # back to a checkpoint taken mid-snapshot
                request_restore(job.storage, job.storage.url("chk-2"), False, False)
                checkpoints += 1
                completed = job.checkpoint()
                assert completed.restored_from == 2
                check(completed, 2)
                last = completed.checkpoint_id
            if cursors[last] is None and "chunk" not in completed.source_positions["src"]:
                break  # a checkpoint after the last chunk: the target is the source at the barrier
        writer.stop.set()
        thread.join()
        final = job.checkpoint()
        check(final, last)
        with writer.lock:
            assert target(tmp / "lake", order) == writer.rows, "after the writer stopped: the source now"
            assert pg_target(server, f"cdc_chunk_{n}_copy", order) == writer.rows, "PostgreSQL: the source now"
    finally:
        writer.stop.set()
        if thread.is_alive():
            thread.join()
        os.environ.pop("CHECKPOINT_FAULTS", None)
    assert cursors[last] is None, "the snapshot finished"
    return checkpoints


def test_a_chunked_snapshot_under_concurrent_writes_loses_and_doubles_nothing(spark, pg, tmp_path):
    checkpoints = scenario(spark, pg, tmp_path / "s0", seed=0, rows=40, chunk=16)
    assert checkpoints >= 7  # 2 tables of 40+ rows in chunks of 16, a failure and a restore between
    for seed in range(1, 1 + int(os.environ.get("CDC_CHUNK_SEEDS", "0"))):
        scenario(spark, pg, tmp_path / f"s{seed}", seed=seed, rows=150, chunk=25 + seed % 7)


def test_a_table_without_a_primary_key_is_refused_before_anything_is_created(spark, pg, tmp_path):
    table = f"cdc_chunk_nokey_{uuid.uuid4().hex[:6]}"
    with pg.connect() as conn:
        conn.execute(f"CREATE TABLE {table} (a int, v int); ALTER TABLE {table} REPLICA IDENTITY FULL")

    def declare(tmp: Path) -> None:
        changes = PostgresCdcSource("src", [table], postgres_conn_id="cdc_pg", slot_name=table, snapshot_chunk_rows=5)
        DeltaTableSink("lake", changes, str(tmp / "lake"), mode="upsert", keys=["a"], delete_when="deleted")

    job = make_job(spark, tmp_path, declare)
    with pytest.raises(CdcSourceError, match=rf"table public.{table} has no primary key: the chunked snapshot"):
        job.checkpoint()
    with pg.connect() as conn:
        assert not conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (table,)).fetchall()


def test_a_whole_snapshot_whose_first_table_is_empty_keeps_the_other_tables_rows(spark, pg, tmp_path):
    """Spark's createDataFrame of an Arrow table stops at its first empty record batch: the snapshot's
    files of an empty table, then a full one, once gave no row at all."""
    n = uuid.uuid4().hex[:6]
    names = [f"cdc_chunk_{n}_a", f"cdc_chunk_{n}_b"]
    with pg.connect() as conn:
        for table in names:
            conn.execute(f"CREATE TABLE {table} (a int, b text, v int, PRIMARY KEY (a, b))")
        conn.execute(f"INSERT INTO {names[1]} SELECT i, 'x', i FROM generate_series(1, 5) AS i")

    def declare(tmp: Path) -> None:
        changes = PostgresCdcSource("src", names, postgres_conn_id="cdc_pg", slot_name=f"cdc_chunk_{n}")
        DeltaTableSink(
            "lake", changes, str(tmp / "lake"), mode="upsert", keys=["source_table", "a", "b"], delete_when="deleted"
        )

    make_job(spark, tmp_path, declare).checkpoint()
    order = [f"public.{t}" for t in names]
    assert target(tmp_path / "lake", order) == {order[0]: {}, order[1]: {(i, "x"): i for i in range(1, 6)}}
