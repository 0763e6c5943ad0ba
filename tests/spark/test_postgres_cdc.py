"""PostgresCdcSource against the real PostgreSQL server (``wal_level=logical``), in-process checkpoints.

Random inserts, updates and deletes, single- and multi-row transactions, TOASTed values left unchanged by
updates, and a transaction open at every barrier run between checkpoints; after every checkpoint the
ParquetTableSink upsert table (keyed by the primary key, deleting on ``deleted``) equals the table as a
plain ``SELECT`` saw it at the barrier (no commit happens between the trigger and that SELECT): the
oracle never goes through our decoder. Then a restore replays, a released slot and a dropped slot are
refused, and the decoder reads the real server's bytes of both protocol versions.
"""

from __future__ import annotations

import itertools
import json
import random
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from airflow_provider_checkpoint.connectors.postgres import cdc_slot
from airflow_provider_checkpoint.connectors.postgres.cdc import PostgresCdcSource
from airflow_provider_checkpoint.connectors.postgres.cdc_types import table_columns
from airflow_provider_checkpoint.connectors.postgres.connection import PgConnection
from airflow_provider_checkpoint.connectors.postgres.pgoutput import Decoder, int_to_lsn, lsn_to_int
from airflow_provider_checkpoint.connectors.postgres.pgoutput_columns import decode_rows
from airflow_provider_checkpoint.dataflow import ParquetTableSink
from airflow_provider_checkpoint.exceptions import CdcSourceError, InjectedFault, SinkConnectionError
from airflow_provider_checkpoint.jobs.audit import audit_job
from airflow_provider_checkpoint.restore.requests import request_restore
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.testing.inprocess import Job, make_job
from tests.servers.postgres import PostgresServer, cdc_connection

pytestmark = pytest.mark.spark
COLUMNS = ["id", "name", "amount", "ok", "d", "ts", "u", "j", "f", "doc"]
DDL = """CREATE TABLE {t} (id int PRIMARY KEY, name text, amount numeric(10,2), ok bool, d date, ts timestamptz,
         u uuid, j jsonb, f float8, doc text); ALTER TABLE {t} REPLICA IDENTITY FULL"""
_tables = itertools.count()


@pytest.fixture
def pg(postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[PostgresServer]:
    """The server, through Airflow connection ``cdc_pg``; the test's slots are dropped after it (a slot
    left behind would hold the session server's WAL)."""
    with cdc_connection(postgres_server, monkeypatch, "cdc_") as server:
        yield server


class Workload:
    """Random transactions against one table; ``keys`` only steers the generator (which ids exist)."""

    def __init__(self, server: PostgresServer, table: str, seed: int) -> None:
        self.conn, self.table, self.rng = server.connect(), table, random.Random(seed)
        self.keys: set[int] = set()
        self.next_id = 1
        self.server = server
        self.committed = 0
        """Row changes committed so far (counted by the test, at commit)."""
        self.at_barrier: list[int] = [0]
        """``committed`` at each checkpoint's barrier, by checkpoint id."""

    def row(self, key: int) -> tuple[Any, ...]:
        r = self.rng
        big = "".join(r.choice("abcdefghij") for _ in range(3000)) if r.random() < 0.2 else f"doc{key}"
        ts = datetime(2025, 1, 1, tzinfo=UTC) + timedelta(seconds=r.randrange(10**8), microseconds=r.randrange(10**6))
        return (
            key,
            r.choice(["ann", "bob", None, "çé", "", 'a "q",\nb']),  # empty is not NULL; CSV quoting
            Decimal(r.randrange(-(10**6), 10**6)) / 100,
            r.choice([True, False, None]),
            date(2020, 1, 1) + timedelta(days=r.randrange(3000)),
            ts,
            uuid.UUID(int=r.getrandbits(128)),
            json.dumps({"k": r.randrange(9), "s": "x"}),
            r.choice([0.1, -2.5e300, float(r.randrange(100)) / 7, None]),
            big,
        )

    def change(self, cur: Any) -> int:
        """One row's insert, update or delete in the current transaction."""
        op = self.rng.choice(["insert", "insert", "update", "update", "toast", "delete"]) if self.keys else "insert"
        if op == "insert":
            key, self.next_id = self.next_id, self.next_id + 1
            cur.execute(f"INSERT INTO {self.table} VALUES ({', '.join(['%s'] * len(COLUMNS))})", self.row(key))
            self.keys.add(key)
            return 1
        key = self.rng.choice(sorted(self.keys))
        if op == "delete":
            cur.execute(f"DELETE FROM {self.table} WHERE id = %s", (key,))
            self.keys.discard(key)
        elif op == "toast":  # leaves doc (TOASTed when long) unchanged: pgoutput sends 'u'
            cur.execute(f"UPDATE {self.table} SET name = %s, f = %s WHERE id = %s", ("t", self.rng.random(), key))
        else:
            values = self.row(key)[1:-1]
            assign = ", ".join(f"{c} = %s" for c in COLUMNS[1:-1])
            cur.execute(f"UPDATE {self.table} SET {assign} WHERE id = %s", (*values, key))
        assert cur.rowcount == 1
        return 1

    def transactions(self, n: int) -> None:
        for _ in range(n):
            with self.conn.transaction():
                changed = sum(self.change(self.conn.cursor()) for _ in range(self.rng.choice([1, 1, 2, 5])))
            self.committed += changed

    def open_transaction(self) -> Callable[[], None]:
        """A transaction with changes, still open: the returned function commits it."""
        other = self.server.connect()
        other.autocommit = False
        changed = sum(self.change(other.cursor()) for _ in range(3))

        def commit() -> None:
            other.commit()
            other.close()
            self.committed += changed

        return commit

    def state(self) -> dict[int, tuple[Any, ...]]:
        """The table now, by plain SELECT, normalized as the Parquet table gives it back."""
        rows = self.conn.execute(f"SELECT {', '.join(COLUMNS)} FROM {self.table}").fetchall()
        return {r[0]: _normal(r) for r in rows}


def _normal(row: tuple[Any, ...]) -> tuple[Any, ...]:
    out = []
    for v in row:
        if isinstance(v, uuid.UUID):
            v = str(v)
        elif isinstance(v, str) and v.startswith("{"):
            v = json.loads(v)
        out.append(v)
    return tuple(out)


def target(tmp: Path) -> dict[int, tuple[Any, ...]]:
    path = tmp / "orders"
    if not path.exists():
        return {}
    rows = ds.dataset(str(path), format="parquet").to_table(columns=COLUMNS).to_pylist()
    found = {r["id"]: _normal(tuple(r[c] for c in COLUMNS)) for r in rows}
    assert len(found) == len(rows), "one row per key"
    return found


def pipeline(table: str | None, slot: str, publication: str | None = None) -> Callable[[Path], None]:
    def declare(tmp: Path) -> None:
        tables = None if table is None else [table]
        changes = PostgresCdcSource(
            "orders_cdc", tables, publication=publication, postgres_conn_id="cdc_pg", slot_name=slot
        )
        ParquetTableSink(
            "orders_table", changes, str(tmp / "orders"), mode="upsert", keys=["id"], delete_when="deleted"
        )

    return declare


def setup(pg: PostgresServer, tmp: Path, spark: Any, retained: int) -> tuple[Workload, Job, str]:
    n = next(_tables)
    table, slot = f"cdc_orders_{n}_{uuid.uuid4().hex[:6]}", f"cdc_test_{n}_{uuid.uuid4().hex[:6]}"
    work = Workload(pg, table, seed=n)
    work.conn.execute(DDL.format(t=table))
    work.transactions(30)  # rows before the job: the snapshot's
    return work, make_job(spark, tmp, pipeline(table, slot), retained_checkpoints=retained), slot


def run(job: Job, work: Workload, commit_open: Callable[[], None] | None) -> dict[int, tuple[Any, ...]]:
    """One checkpoint; between its trigger and its steps: the oracle's SELECT, then the open transaction
    commits and more transactions run (all after the barrier)."""
    seen: dict[int, tuple[Any, ...]] = {}

    def during() -> None:
        seen.update(work.state())
        work.at_barrier.append(work.committed)
        if commit_open:
            commit_open()
        work.transactions(5)

    completed = job.checkpoint(during=during)
    assert target(job.tmp) == seen
    checkpoint = completed.checkpoint_id
    changes = work.at_barrier[checkpoint] - work.at_barrier[checkpoint - 1]
    assert completed.stats["records_in"] == (len(seen) if checkpoint == 1 else changes), "each change once"
    return seen


def test_changes_reach_the_upsert_table_exactly_as_the_source_was_at_each_barrier(spark, pg, tmp_path):
    work, job, slot = setup(pg, tmp_path, spark, retained=3)
    run(job, work, None)  # the snapshot, then changes after its barrier
    for _ in range(3):
        work.transactions(25)
        run(job, work, work.open_transaction())
    restored_lsn = lsn_to_int(job.coordinator.store.load(3).source_positions["orders_cdc"]["lsn"])
    with pg.connect() as conn:  # the slot keeps the WAL of the oldest retained checkpoint (2), no more
        held = cdc_slot.state(conn, slot)
        assert held and held.confirmed_flush == lsn_to_int(
            job.coordinator.store.load(2).source_positions["orders_cdc"]["lsn"]
        )
    request_restore(job.storage, job.storage.url("chk-3"), False, False)
    replayed = job.checkpoint()  # replays everything since checkpoint 3's barrier
    assert replayed.restored_from == 3 and replayed.stats["records_in"] == work.committed - work.at_barrier[3]
    assert target(tmp_path) == work.state()
    assert restored_lsn <= lsn_to_int(replayed.source_positions["orders_cdc"]["lsn"])
    assert audit_job(job.storage, 3) == []
    kept = sorted(p.name for p in (tmp_path / "ckpt" / "multi" / "_sources" / "orders_cdc").rglob("*") if p.is_file())
    assert kept == ["slot.json"], "the snapshot's files are deleted once its checkpoint completed"


def test_a_released_invalidated_or_dropped_slot_is_refused_never_skipped(spark, pg, tmp_path):
    work, job, slot = setup(pg, tmp_path, spark, retained=1)
    job.checkpoint(savepoint_target=f"file://{tmp_path}/savepoints/one")
    work.transactions(3)
    job.checkpoint()  # retention 1: the slot is advanced to checkpoint 2's position
    assert target(tmp_path) == work.state()
    request_restore(job.storage, f"file://{tmp_path}/savepoints/one", False, False)
    with pytest.raises(CdcSourceError, match=rf"slot {slot} was released up to .* past position"):
        job.checkpoint()
    request_restore(job.storage, job.storage.url("chk-2"), False, False)
    with pg.connect() as conn:  # the server removes WAL the slot holds past max_slot_wal_keep_size
        conn.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        conn.execute("SELECT pg_reload_conf()")
        try:
            for _ in range(3):  # a little WAL, then a new 16 MB segment: the slot's segments fall behind
                conn.execute("SELECT pg_logical_emit_message(false, 'cdc-test', 'x')")
                conn.execute("SELECT pg_switch_wal()")
            conn.execute("CHECKPOINT")
        finally:
            conn.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
            conn.execute("SELECT pg_reload_conf()")
        invalidated = cdc_slot.state(conn, slot)
        assert invalidated and invalidated.wal_status == "lost", invalidated
    with pytest.raises(CdcSourceError, match=rf"replication slot {slot} was invalidated \(wal_removed"):
        job.checkpoint()
    with pg.connect() as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    with pytest.raises(CdcSourceError, match=rf"replication slot {slot} does not exist"):
        job.checkpoint()


@pytest.mark.parametrize("version", ["1", "2"])
def test_the_decoder_reads_the_real_servers_messages(pg, version):
    table, slot = f"cdc_bytes_{version}_{uuid.uuid4().hex[:6]}", f"cdc_bytes_{version}_{uuid.uuid4().hex[:6]}"
    with pg.connect() as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text); CREATE PUBLICATION {slot} FOR TABLE {table}")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        with conn.transaction():
            conn.execute(f"INSERT INTO {table} VALUES (1, 'a'), (2, NULL)")
            conn.execute(f"UPDATE {table} SET v = 'b' WHERE id = 1")
        conn.execute(f"DELETE FROM {table} WHERE id = 2")
        rows = conn.execute(
            "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', %s, "
            "'publication_names', %s)",
            (slot, version, slot),
        ).fetchall()
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    first, second = Decoder(slot).transactions(bytes(r[0]) for r in rows)
    assert [(c.op, c.values) for c in first.changes] == [
        ("insert", ("1", "a")),
        ("insert", ("2", None)),
        ("update", ("1", "b")),
    ]
    assert [(c.op, c.values) for c in second.changes] == [("delete", ("2", None))]
    assert first.commit_lsn < second.commit_lsn and first.xid != second.xid
    assert abs(first.commit_time_micros / 1e6 - datetime.now(UTC).timestamp()) < 600


def test_a_peek_the_server_joins_holds_every_message_in_order(pg, monkeypatch):
    table, slot = f"cdc_peek_{uuid.uuid4().hex[:6]}", f"cdc_peek_{uuid.uuid4().hex[:6]}"
    with pg.connect() as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text); CREATE PUBLICATION {slot} FOR TABLE {table}")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        for i in range(3):
            with conn.transaction():
                conn.execute(
                    f"INSERT INTO {table} SELECT g, repeat('é', g % 40) "
                    f"FROM generate_series({i * 100}, {i * 100 + 99}) AS g"
                )
                conn.execute(f"DELETE FROM {table} WHERE id % 7 = 0")
        upto = cdc_slot.flush_lsn(conn) + 1
        want = conn.execute(
            "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, NULL, 'proto_version', '1', "
            "'publication_names', %s)",
            (slot, int_to_lsn(upto), slot),
        ).fetchall()
        one_row = cdc_slot.peek(conn, slot, slot, upto)
        monkeypatch.setattr(cdc_slot, "PEEK_ONE_ROW", 0)  # a row per 1,000 bytes of messages
        monkeypatch.setattr(cdc_slot, "PEEK_BYTES", 1000)
        rows = cdc_slot.peek(conn, slot, slot, upto)
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    assert len(want) > 300
    for got in (one_row, rows):
        assert [got.message(i) for i in range(len(got))] == [bytes(r[0]) for r in want]


def test_a_slot_the_job_did_not_create_is_never_taken_its_own_is_taken_anew(spark, pg, tmp_path):
    table, slot = f"cdc_taken_{uuid.uuid4().hex[:6]}", f"cdc_taken_{uuid.uuid4().hex[:6]}"
    with pg.connect() as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY)")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        job = make_job(spark, tmp_path, pipeline(table, slot))
        with pytest.raises(CdcSourceError, match=rf"slot {slot} exists and this job did not create it"):
            job.checkpoint()
        assert cdc_slot.state(conn, slot) is not None, "another job's slot is left alone"
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        conn.execute(f"INSERT INTO {table} SELECT generate_series(1, 20)")
        job.coordinator.trigger("abandoned", now=0.0)  # creates the slot, then its run dies before any step
        first = cdc_slot.state(conn, slot)
        conn.execute(f"DELETE FROM {table} WHERE id > 15")
        job.checkpoint()  # aborts the abandoned attempt; the job's own slot is dropped and taken anew
        again = cdc_slot.state(conn, slot)
        assert first and again and again.confirmed_flush > first.confirmed_flush
        rows = ds.dataset(str(tmp_path / "orders"), format="parquet").to_table(columns=["id"]).column("id")
        assert sorted(rows.to_pylist()) == list(range(1, 16))


def test_unchanged_toast_without_replica_identity_full_and_truncate_are_refused(pg):
    table, slot = f"cdc_toast_{uuid.uuid4().hex[:6]}", f"cdc_toast_{uuid.uuid4().hex[:6]}"
    rng = random.Random(3)
    big = "".join(rng.choice("abcdefghij") for _ in range(3000))  # stored out of line
    with pg.connect() as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text, doc text)")
        conn.execute(f"CREATE PUBLICATION {slot} FOR TABLE {table}")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        conn.execute(f"INSERT INTO {table} VALUES (1, 'a', %s)", (big,))
        conn.execute(f"UPDATE {table} SET v = 'b' WHERE id = 1")
        conn.execute(f"TRUNCATE {table}")
        catalog = {f"public.{table}": {c.name: c for c in table_columns(conn, f"public.{table}")}}
        rows = conn.execute(
            "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', '1', "
            "'publication_names', %s)",
            (slot, slot),
        ).fetchall()
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    messages = [bytes(r[0]) for r in rows]
    inserted, updated, truncated = (t.commit_lsn for t in Decoder(slot).transactions(messages))
    columns = list(catalog[f"public.{table}"].values())

    def decoded(lsn: int) -> Any:
        return decode_rows("src", slot, messages, columns, catalog, (lsn, lsn + 1))

    assert decoded(inserted)[0].column("doc").to_pylist() == [big]
    with pytest.raises(
        CdcSourceError, match=rf"update of table public.{table} left TOASTed column doc .*REPLICA IDENTITY FULL"
    ):
        decoded(updated)
    with pytest.raises(CdcSourceError, match=rf"TRUNCATE of public.{table} .* cannot be applied as row changes"):
        decoded(truncated)


def test_tables_of_a_publication_and_a_table_added_to_it_later_is_refused(spark, pg, tmp_path):
    table, other, slot = (f"cdc_pub_{n}_{uuid.uuid4().hex[:6]}" for n in ("a", "b", "slot"))
    with pg.connect() as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY); CREATE TABLE {other} (id int PRIMARY KEY)")
        conn.execute(f"CREATE PUBLICATION {slot} FOR TABLE {table}")
        conn.execute(f"INSERT INTO {table} VALUES (1), (2)")
        job = make_job(spark, tmp_path, pipeline(None, slot, publication=slot))
        job.checkpoint()
        conn.execute(f"INSERT INTO {table} VALUES (3)")
        conn.execute(f"DELETE FROM {table} WHERE id = 1")
        job.checkpoint()
        rows = ds.dataset(str(tmp_path / "orders"), format="parquet").to_table(columns=["id"]).column("id")
        assert sorted(rows.to_pylist()) == [2, 3]
        assert job.checkpoint().stats["records_in"] == 0  # no change since: an empty checkpoint
        conn.execute(f"ALTER PUBLICATION {slot} ADD TABLE {other}")
        with pytest.raises(CdcSourceError, match=rf"tables changed since the snapshot \(added \['public.{other}'\]"):
            job.checkpoint()


def test_a_retried_step_a_finalize_crash_and_a_server_crash_lose_and_double_nothing(spark, pg, tmp_path, monkeypatch):
    work, job, slot = setup(pg, tmp_path, spark, retained=2)
    run(job, work, None)
    faults = "step.before_ack:checkpoint=2:attempt=1,finalize.after_metadata:checkpoint=3"
    monkeypatch.setenv("CHECKPOINT_FAULTS", faults)
    work.transactions(10)
    run(job, work, work.open_transaction())  # the step fails once; its retry peeks the same changes
    assert [(c, a) for c, _, a in job.step_runs if c == 2] == [(2, 1), (2, 2)]
    work.transactions(10)
    with pytest.raises(InjectedFault):  # _metadata of 3 is written, then finalize dies: nothing committed yet
        run(job, work, work.open_transaction())
    pg.kill()  # the server crashes between checkpoints: the slot survives it
    pg.start()
    work.conn = pg.connect()
    work.transactions(10)
    run(job, work, None)  # the trigger finishes 3 (sinks, slot), then 4 reads from 3's barrier
    assert job.coordinator.store.load(4).restored_from == 3


def test_a_table_without_row_identity_is_refused_before_anything_is_created(pg, tmp_path):
    table, slot = f"cdc_nokey_{uuid.uuid4().hex[:6]}", f"cdc_nokey_{uuid.uuid4().hex[:6]}"
    with pg.connect() as conn:
        conn.execute(f"CREATE TABLE {table} (id int, v text)")
        source = PostgresCdcSource("nokey", [table], postgres_conn_id="cdc_pg", slot_name=slot)
        source.bind_storage(JobStorage.for_job(f"file://{tmp_path}/ckpt", "nokey"))
        with pytest.raises(CdcSourceError, match=rf"table public.{table} has no primary key: .* REPLICA IDENTITY FULL"):
            source.barrier_position(None)
        assert not conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (slot,)).fetchone()
        assert cdc_slot.state(conn, slot) is None
        conn.execute(f"DELETE FROM {table}")  # the application's deletes still work: nothing was published


def test_a_role_that_may_not_replicate_is_refused_not_retried(pg, postgres_server):
    """The server refuses a replication connection (the slot's creation) to a role without REPLICATION with
    a FATAL line then a DETAIL line: a refusal (:class:`SinkConnectionError`), never retried as unavailable,
    and the message says why without the password."""
    role, password = f"cdc_norepl_{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    with pg.connect() as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
    try:
        source = PgConnection("c", "127.0.0.1", postgres_server.port, role, "postgres", password)
        with pytest.raises(SinkConnectionError, match="REPLICATION attribute") as refused:
            source.connect(autocommit=True, replication=True)
        assert password not in str(refused.value)
    finally:
        with pg.connect() as conn:
            conn.execute(f"DROP ROLE {role}")
