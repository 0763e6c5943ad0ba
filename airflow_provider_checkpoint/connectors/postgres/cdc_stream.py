"""Reading a span of :class:`~.cdc.PostgresCdcSource`'s slot over the streaming replication protocol, never
consuming it.

``START_REPLICATION SLOT s LOGICAL <start> (proto_version '1', publication_names 'p')`` on a replication
connection: the walsender decodes the WAL and sends each transaction's pgoutput messages as it reaches its
commit, so the server's decoding, the transfer and our reading overlap (a SQL peek decodes the whole span on
the server before sending a byte). The read stops at the first transaction whose commit LSN is at or after
``end`` (transactions come in commit order), or once the server says it has decoded the WAL up to ``end``
(a keepalive whose WAL position is at or past it: a span with no change, or the barrier past the last
record). Then CopyDone ends the stream and the server releases the slot before it answers, so the next user of
the slot (the finalize's advance) never finds it active.

**The slot never moves**: the only position we send (a standby status update, answering the server's
keepalives) is flush 0, which the server ignores (walsender ``ProcessStandbyReplyMessage`` confirms only a
valid flush position); ``confirmed_flush_lsn`` moves only through :func:`.cdc_slot.advance`.

What the connection needs is what a SQL peek needed: the user's ``REPLICATION`` attribute (or superuser). A
logical replication connection names its database and ``pg_hba.conf`` matches it by that database's lines,
as any connection (the ``replication`` keyword there is for physical replication only).
"""

from __future__ import annotations

import logging
import select
import struct
import time
from typing import Any

import numpy as np

from airflow_provider_checkpoint.connectors.postgres.cdc_types import quote
from airflow_provider_checkpoint.connectors.postgres.connection import PgConnection
from airflow_provider_checkpoint.connectors.postgres.pgoutput import int_to_lsn
from airflow_provider_checkpoint.connectors.postgres.pgoutput_batch import Messages
from airflow_provider_checkpoint.exceptions import CdcSourceError, SinkConnectionError, SinkUnavailableError

log = logging.getLogger(__name__)

STALL_SECONDS = 120.0
"""The read fails if the server's position has not moved for this long before reaching the span's end (the
server sends nothing while it decodes a long transaction of other tables, at most until it asks for a reply,
``wal_sender_timeout`` / 2: 30 s by default)."""
REPLY_EVERY = 0.05
"""Seconds between our answers to keepalives that are short of the span's end (each answer lets the server
send its next keepalive)."""
_HEADER = 25
"""XLogData: ``w``, the record's LSN, the server's WAL end, its clock (8 bytes each)."""
_KEEPALIVE = struct.Struct(">cQQB")
_STATUS = struct.Struct(">cQQQQB")
_BEGIN = ord("B")
_COPY_BOTH = 8
_COMMAND_OK = 1
_EPOCH_2000 = 946_684_800


def stream(
    pg: PgConnection,
    uid: str,
    slot: str,
    publication: str,
    span: tuple[int, int],
    flushed: int,
    stall: float | None = None,
) -> Messages:
    """Every pgoutput message of the transactions whose commit LSN lies in ``span`` (``[start, end)``; the
    stream may begin with transactions before ``start`` and the read ends at the first at or after ``end``:
    callers filter by commit LSN), in commit order; the slot does not move. ``flushed``: the server's WAL
    flush position read before the call; an ``end`` past it (nothing written there yet) reads up to it. The
    server lost, or its position unmoved for ``stall`` seconds (:data:`STALL_SECONDS`) short of the end,
    raises :class:`SinkUnavailableError` (the step is retried)."""
    start, end = span
    try:
        replication = pg.connect(autocommit=True, replication=True)
    except SinkConnectionError as e:
        raise SinkConnectionError(
            f"source {uid}: {e}. Reading the slot needs a user with the REPLICATION attribute "
            f"(ALTER ROLE {pg.user} REPLICATION) or a superuser"
        ) from None
    with replication:
        try:
            return _read(
                replication.pgconn, uid, slot, publication, (start, end, min(end, flushed)), stall or STALL_SECONDS
            )
        except OSError as e:  # the socket closed under us
            raise SinkUnavailableError(f"source {uid}: replication stream of slot {slot} broke: {e}") from e


def _read(pgconn: Any, uid: str, slot: str, publication: str, span: tuple[int, int, int], stall: float) -> Messages:
    start, end, decoded = span  # done once the server has decoded the WAL up to ``decoded``
    names = quote(publication).replace("'", "''")  # a string literal of quoted names
    command = (
        f"START_REPLICATION SLOT {quote(slot)} LOGICAL {int_to_lsn(start)} "
        f"(proto_version '1', publication_names '{names}')"
    )
    result = pgconn.exec_(command.encode())
    if result.status != _COPY_BOTH:
        message = (result.error_message or pgconn.error_message).decode(errors="replace").strip()
        if "is active for PID" in message:  # another reader or the advance, for a moment
            raise SinkUnavailableError(f"source {uid}: replication slot {slot} is in use: {message}")
        raise CdcSourceError(f"source {uid}: cannot read replication slot {slot}: {message}")
    data, sizes = bytearray(), []
    position, moved, replied, owed = start, time.monotonic(), 0.0, False
    while True:
        n, buf = pgconn.get_copy_data(1)
        if n > 0:
            kind = buf[0]
            if kind == 0x77:  # w: XLogData
                if n > _HEADER and buf[_HEADER] == _BEGIN and int.from_bytes(buf[_HEADER + 1 : _HEADER + 9]) >= end:
                    break  # a transaction committed at or after the end, and every later one
                data += buf[_HEADER:]
                sizes.append(n - _HEADER)
                position, moved = max(position, int.from_bytes(buf[1:9])), time.monotonic()
            elif kind == 0x6B:  # k: keepalive
                _, wal_end, _, reply = _KEEPALIVE.unpack(buf)
                if wal_end >= decoded:
                    break  # the server has decoded the WAL up to the end: nothing more in the span
                if wal_end > position:
                    position, moved = wal_end, time.monotonic()
                owed = True
                if reply:
                    replied = _status(pgconn)
                    owed = False
            continue
        if n < 0:
            raise SinkUnavailableError(
                f"source {uid}: replication stream of slot {slot} ended before {int_to_lsn(end)} (at "
                f"{int_to_lsn(position)}): {pgconn.error_message.decode(errors='replace').strip()}"
            )
        now = time.monotonic()
        if now - moved > stall:
            raise SinkUnavailableError(
                f"source {uid}: replication slot {slot} sent nothing past {int_to_lsn(position)} for {stall:.0f} s "
                f"short of the checkpoint's end {int_to_lsn(end)}; retried"
            )
        if owed and now - replied >= REPLY_EVERY:
            replied, owed = _status(pgconn), False
        wait = REPLY_EVERY if owed else 1.0
        if not select.select([pgconn.socket], [], [], wait)[0]:
            continue
        pgconn.consume_input()
    _finish(pgconn, uid, slot)
    return Messages.framed(bytes(data), np.array(sizes, np.int64))


def _status(pgconn: Any) -> float:
    """Answer the server with a standby status update whose positions are 0 (flush 0: the slot stays)."""
    clock = int((time.time() - _EPOCH_2000) * 1_000_000)
    pgconn.put_copy_data(_STATUS.pack(b"r", 0, 0, 0, clock, 0))
    pgconn.flush()
    return time.monotonic()


def _finish(pgconn: Any, uid: str, slot: str) -> None:
    """End the stream (CopyDone), drain what the server sent meanwhile, and read its answer: the server has
    released the slot when it answers."""
    pgconn.put_copy_end()
    pgconn.flush()
    while True:
        n, _ = pgconn.get_copy_data(0)
        if n == -1:
            break
        if n == -2:
            raise SinkUnavailableError(
                f"source {uid}: replication slot {slot}: {pgconn.error_message.decode(errors='replace').strip()}"
            )
    while (result := pgconn.get_result()) is not None:
        if result.status not in (_COMMAND_OK, 2):  # the walsender may answer a row (timeline) then CommandComplete
            raise SinkUnavailableError(
                f"source {uid}: replication slot {slot}: {result.error_message.decode(errors='replace').strip()}"
            )
