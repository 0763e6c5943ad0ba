"""The slot read over the streaming replication protocol (``cdc_stream``), on the real server: the messages of
exactly the span's transactions (the SQL peek of the same slot is the oracle), the slot never moved and free
again once the read returns, a span with no change, a stall, and a role that may not replicate."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from airflow_provider_checkpoint.connectors.postgres import cdc_slot, cdc_stream
from airflow_provider_checkpoint.connectors.postgres.connection import PgConnection
from airflow_provider_checkpoint.connectors.postgres.pgoutput import Decoder, int_to_lsn
from airflow_provider_checkpoint.exceptions import CdcSourceError, SinkConnectionError, SinkUnavailableError
from tests.servers.postgres import PostgresServer, cdc_connection


@pytest.fixture
def pg(postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[PostgresServer]:
    with cdc_connection(postgres_server, monkeypatch, "cdc_stream_") as server:
        yield server


def _slot(conn, table: str, slot: str, transactions: int) -> list[int]:
    """A table, its publication and slot (both named ``slot``), then ``transactions`` transactions of inserts
    and deletes; each transaction's commit LSN, read back from the SQL peek."""
    conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text); CREATE PUBLICATION {slot} FOR TABLE {table}")
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    for i in range(transactions):
        with conn.transaction():
            conn.execute(
                f"INSERT INTO {table} SELECT g, repeat('é', g % 40) FROM generate_series({i * 100}, {i * 100 + 99}) g"
            )
            conn.execute(f"DELETE FROM {table} WHERE id % 7 = 0")
    return [t.commit_lsn for t in Decoder(slot).transactions(_peeked(conn, slot, cdc_slot.flush_lsn(conn) + 1))]


def _peeked(conn, slot: str, upto: int) -> list[bytes]:
    rows = conn.execute(
        "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, NULL, 'proto_version', '1', "
        "'publication_names', %s)",
        (slot, int_to_lsn(upto), slot),
    ).fetchall()
    return [bytes(r[0]) for r in rows]


def _slot_row(conn, slot: str) -> tuple:
    return conn.execute(
        "SELECT confirmed_flush_lsn, restart_lsn, catalog_xmin, active FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    ).fetchone()


def _read(pg: PostgresServer, slot: str, span: tuple[int, int], flushed: int, **kw) -> list[bytes]:
    got = cdc_stream.stream(PgConnection.from_airflow("cdc_pg"), "s", slot, slot, span, flushed, **kw)
    return [got.message(i) for i in range(len(got))]


def test_the_stream_holds_the_spans_transactions_in_order_and_never_moves_the_slot(pg):
    table = slot = f"cdc_stream_{uuid.uuid4().hex[:6]}"
    with pg.connect() as conn:
        commits = _slot(conn, table, slot, 4)
        before = _slot_row(conn, slot)
        flushed = cdc_slot.flush_lsn(conn)
        everything = _peeked(conn, slot, flushed + 1)
        # the span ends at the third transaction's commit: the first two, whole; the read stops at the third
        got = _read(pg, slot, (commits[0], commits[2]), flushed)
        assert _slot_row(conn, slot) == before, "the slot did not move and is free again (not active)"
        txns = list(Decoder(slot).transactions(got))
        assert [t.commit_lsn for t in txns] == commits[:2]
        assert got == everything[: len(got)], "the server's messages, in order, as the SQL peek gives them"
        # from the second transaction on: the server skips the first; to the end of the WAL
        got = _read(pg, slot, (commits[1], flushed), flushed)
        txns = list(Decoder(slot).transactions(got))  # a session's first change of a table sends its Relation
        assert [t.commit_lsn for t in txns] == commits[1:]
        want = list(Decoder(slot).transactions(everything))[1:]
        assert [[(c.op, c.values) for c in t.changes] for t in txns] == [
            [(c.op, c.values) for c in t.changes] for t in want
        ]
        # a span with no change, its end past the last record: ends at the WAL's end
        assert _read(pg, slot, (flushed, flushed + (1 << 20)), flushed) == []
        assert _slot_row(conn, slot) == before


def test_a_stream_short_of_its_end_fails_after_the_stall_never_hangs(pg):
    table = slot = f"cdc_stream_{uuid.uuid4().hex[:6]}"
    with pg.connect() as conn:
        _slot(conn, table, slot, 1)
        before = _slot_row(conn, slot)
        flushed = cdc_slot.flush_lsn(conn)
        end = flushed + (1 << 30)  # WAL nobody writes
        with pytest.raises(
            SinkUnavailableError, match=rf"slot {slot} sent nothing past .* short of .*{int_to_lsn(end)}"
        ):
            _read(pg, slot, (flushed, end), end, stall=1.0)
        assert _slot_row(conn, slot) == before, "answering the server's keepalives moved nothing; free again"


def test_a_replication_connection_refused_says_what_it_needs(pg, postgres_server):
    """A role without the REPLICATION attribute: refused (not retried), the message says the fix and not the
    password. (pg_hba.conf: a logical replication connection is matched by its database's lines, as a SQL
    connection is; the ``replication`` keyword is for physical replication only.)"""
    role, password = f"cdc_stream_{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    with pg.connect() as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
    source = PgConnection("c", "127.0.0.1", postgres_server.port, role, "postgres", password)
    try:
        with pytest.raises(SinkConnectionError, match=rf"REPLICATION attribute.*ALTER ROLE {role} REPLICATION") as e:
            cdc_stream.stream(source, "s", "any", "any", (0, 1), 1)
        assert password not in str(e.value)
        with pg.connect() as conn:
            conn.execute(f"ALTER ROLE {role} REPLICATION")
        with pytest.raises(CdcSourceError, match='replication slot "any" does not exist'):
            cdc_stream.stream(source, "s", "any", "any", (0, 1), 1)
    finally:
        with pg.connect() as conn:
            conn.execute(f"DROP ROLE {role}")
