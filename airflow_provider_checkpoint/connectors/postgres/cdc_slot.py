"""The logical replication slot of :class:`~.cdc.PostgresCdcSource`: created (with an exported snapshot, or
without for the chunked snapshot),
checked before every use, peeked (never consumed) and advanced once no restorable checkpoint needs its WAL."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from airflow_provider_checkpoint.connectors.postgres.cdc_types import quote
from airflow_provider_checkpoint.connectors.postgres.pgoutput import int_to_lsn, lsn_to_int
from airflow_provider_checkpoint.connectors.postgres.pgoutput_batch import Messages
from airflow_provider_checkpoint.exceptions import CdcSourceError

log = logging.getLogger(__name__)

PEEK_ONE_ROW = 128 << 20
"""A peek of at most this much WAL comes as one row (its messages: one ``bytea`` value, at most 1 GiB). pgoutput
takes at most ~6 times the WAL of the changes it sends (a row of 1,600 null columns: a byte per column against a
bit); a longer peek is cut into rows of :data:`PEEK_BYTES` by a running sum over the messages and a sort, which cost
0.2–0.3 s at 500,000 narrow changes (90 MB of WAL) on top of the server's 0.4 s."""
PEEK_BYTES = 64 << 20
"""About how many bytes of messages one row of a longer peek holds."""
PEEK_WORK_MEM = "64MB"
"""``work_mem`` of a one-row peek's transaction: the server's list of the span's messages (the function's
result) and the joins' sort stay in memory instead of temporary files (at the default 4 MB, 100,000 messages
of 50 bytes go through 7 MB of them); bounded as the joined row is (:data:`PEEK_ONE_ROW`)."""


@dataclass(frozen=True)
class SlotState:
    confirmed_flush: int
    wal_status: str | None
    invalidation_reason: str | None
    plugin: str | None


def state(conn: Any, slot: str) -> SlotState | None:
    """The slot's state, ``None`` if there is no such slot."""
    row = conn.execute(
        "SELECT confirmed_flush_lsn::text, wal_status, invalidation_reason, plugin "
        "FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    ).fetchone()
    if row is None:
        return None
    return SlotState(lsn_to_int(row[0]) if row[0] else 0, row[1], row[2], row[3])


def check(conn: Any, source: str, slot: str, lsn: int) -> SlotState:
    """The slot's state if it still holds every change committed at or after ``lsn``; else
    :class:`CdcSourceError` saying why (dropped, invalidated, or advanced past ``lsn``) and what to do."""
    found = state(conn, slot)
    fix = (
        "Changes since that position are no longer available from PostgreSQL: restore a newer checkpoint, "
        "or start a new job (another job_id) to take a new snapshot"
    )
    if found is None:
        raise CdcSourceError(f"source {source}: replication slot {slot} does not exist (dropped?). {fix}")
    if found.wal_status == "lost" or found.invalidation_reason:
        raise CdcSourceError(
            f"source {source}: replication slot {slot} was invalidated "
            f"({found.invalidation_reason or 'wal_status lost'}; e.g. by max_slot_wal_keep_size). {fix}"
        )
    if found.plugin != "pgoutput":
        raise CdcSourceError(f"source {source}: replication slot {slot} uses plugin {found.plugin}, not pgoutput")
    if found.confirmed_flush > lsn:
        raise CdcSourceError(
            f"source {source}: replication slot {slot} was released up to {int_to_lsn(found.confirmed_flush)}, "
            f"past position {int_to_lsn(lsn)} the checkpoint needs. {fix}"
        )
    return found


def create_with_snapshot(replication: Any, slot: str) -> tuple[int, str]:
    """Create the slot on ``replication`` (a replication connection, which must stay open and idle while
    the snapshot is read) exporting its snapshot; its consistent point and the snapshot's name."""
    result = replication.pgconn.exec_(
        f"CREATE_REPLICATION_SLOT {quote(slot)} LOGICAL pgoutput (SNAPSHOT 'export')".encode()
    )
    if result.status != 2:  # PGRES_TUPLES_OK
        message = result.error_message.decode(errors="replace").strip()
        raise CdcSourceError(f"cannot create replication slot {slot}: {message}")
    return lsn_to_int(result.get_value(0, 1).decode()), result.get_value(0, 2).decode()


def create(conn: Any, slot: str) -> int:
    """Create the slot without exporting a snapshot (the chunked snapshot reads each chunk in a snapshot of its
    own); its consistent point. Returns once the transactions running now have ended."""
    try:
        (lsn,) = conn.execute(
            "SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,)
        ).fetchone()
    except Exception as e:
        raise CdcSourceError(f"cannot create replication slot {slot}: {str(e).strip()}") from e
    return lsn_to_int(lsn)


def drop(conn: Any, slot: str) -> None:
    conn.execute("SELECT pg_drop_replication_slot(%s) FROM pg_replication_slots WHERE slot_name = %s", (slot, slot))


def advance(conn: Any, slot: str, lsn: int) -> bool:
    """Move the slot to ``lsn`` (its WAL before that is released) if it is behind; whether it moved. One
    statement: the server looks the slot up and advances it (no round trip between)."""
    row = conn.execute(
        "SELECT pg_replication_slot_advance(slot_name, %s::pg_lsn) FROM pg_replication_slots "
        "WHERE slot_name = %s AND confirmed_flush_lsn < %s::pg_lsn",
        (int_to_lsn(lsn), slot, int_to_lsn(lsn)),
    ).fetchone()
    return row is not None


def peek(conn: Any, slot: str, publication: str, upto: int, found: SlotState | None = None) -> Messages:
    """Every pgoutput message the slot holds for transactions committed before ``upto`` (and possibly one
    at or after it: callers filter by commit LSN), in commit order; the slot does not move. The server joins
    the messages (``string_agg``, in their order) and their lengths: one row when the slot holds at most
    :data:`PEEK_ONE_ROW` of WAL before ``upto``, else a row per :data:`PEEK_BYTES` of messages or so; not a
    row per message. ``found``: the slot's state as the caller just read it on ``conn`` (else read here)."""
    import numpy as np

    found = found or state(conn, slot)
    changes = (
        "pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, NULL, 'proto_version', '1', 'publication_names', %s) "
        "WITH ORDINALITY AS m(lsn, xid, data, n)"
    )
    joined = "string_agg(int4send(length(data)), ''::bytea ORDER BY n), string_agg(data, ''::bytea ORDER BY n)"
    if found is not None and upto - found.confirmed_flush <= PEEK_ONE_ROW:
        query = f"SELECT {joined} FROM {changes}"
        conn.execute(f"SET LOCAL work_mem = '{PEEK_WORK_MEM}'")  # until the caller's transaction ends
    else:  # a bytea holds at most 1 GiB
        query = (
            f"SELECT {joined} FROM (SELECT n, data, sum(length(data)) OVER (ORDER BY n) / {PEEK_BYTES} AS part "
            f"FROM {changes}) AS m GROUP BY part ORDER BY part"
        )
    params = (slot, int_to_lsn(upto), quote(publication))
    rows = conn.execute(query, params, binary=True).fetchall()  # bytea as it is, not hex
    sizes = np.frombuffer(b"".join(r[0] or b"" for r in rows), ">i4").astype(np.int64)
    return Messages.framed(b"".join(r[1] or b"" for r in rows), sizes)


def flush_lsn(conn: Any) -> int:
    (text,) = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
    return lsn_to_int(text)
