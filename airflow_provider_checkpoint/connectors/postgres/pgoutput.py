"""Decoding of PostgreSQL's ``pgoutput`` logical replication messages (protocol versions 1 and 2), as
``pg_logical_slot_peek_binary_changes`` returns them, into whole committed transactions.

The message formats are PostgreSQL's "Logical Replication Message Formats" (protocol chapter): Begin,
Commit, Origin, Relation, Type, Insert, Update, Delete, Truncate and logical decoding Message. Column
values arrive as text (``binary`` is never asked for) or as the markers null (``n``) and unchanged TOASTed
value (``u``). Streamed in-progress transactions (protocol 2 with ``streaming``) are never asked for either:
their messages are refused, so a transaction always arrives whole, between its Begin and its Commit.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from airflow_provider_checkpoint.exceptions import CdcSourceError

UNCHANGED = object()
"""A value pgoutput did not send because it is TOASTed and the update did not change it (``u``)."""

POSTGRES_EPOCH_MICROS = 946_684_800_000_000
"""2000-01-01 in microseconds since the Unix epoch: pgoutput's timestamps count from it."""

Value = str | None | object
"""A column value: its text, ``None`` (SQL NULL), or :data:`UNCHANGED`."""


def lsn_to_int(text: str) -> int:
    """``'16/B374D848'`` as the 64-bit integer it writes."""
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) + int(low, 16)


def int_to_lsn(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


@dataclass(frozen=True)
class Column:
    name: str
    type_oid: int
    type_modifier: int
    key: bool


@dataclass(frozen=True)
class Relation:
    oid: int
    namespace: str
    name: str
    replica_identity: str
    """``d`` default (primary key), ``n`` nothing, ``f`` full, ``i`` index."""
    columns: tuple[Column, ...]

    @property
    def qualified(self) -> str:
        return f"{self.namespace}.{self.name}"


@dataclass(frozen=True)
class Change:
    """One row change: ``op`` insert, update or delete, the relation, and the row's values (an update's and
    an insert's new row; a delete's old row, whole under ``REPLICA IDENTITY FULL``, else its key columns only
    and the others ``None``); ``old``: the whole old row, when the server sent it (``REPLICA IDENTITY FULL``);
    ``old_key``: an update's old row as sent (``K``: its key columns, others ``None``, sent when the key
    changed; ``O``: the whole old row)."""

    op: str
    relation: Relation
    values: tuple[Value, ...]
    old: tuple[Value, ...] | None = None
    old_key: tuple[Value, ...] | None = None


@dataclass
class Transaction:
    xid: int
    commit_lsn: int
    """The LSN of the commit record (Begin's final LSN): the position that orders transactions."""
    end_lsn: int
    commit_time_micros: int
    """Microseconds since the Unix epoch."""
    changes: list[Change] = field(default_factory=list)
    truncated: list[Relation] = field(default_factory=list)


DECODE_ERRORS = (struct.error, ValueError, UnicodeDecodeError, IndexError)
"""What decoding a malformed message raises."""
_INT16, _INT32 = struct.Struct(">h"), struct.Struct(">i")
_STRUCTS = {fmt: struct.Struct(fmt) for fmt in (">q", ">I", ">i", ">h", ">b")}


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> int:
        form = _STRUCTS[fmt]
        (value,) = form.unpack_from(self.data, self.at)
        self.at += form.size
        return int(value)

    def string(self) -> str:
        end = self.data.index(b"\0", self.at)
        text = self.data[self.at : end].decode()
        self.at = end + 1
        return text

    def raw(self, n: int) -> bytes:
        chunk = self.data[self.at : self.at + n]
        if len(chunk) != n:
            raise ValueError("message ends inside a value")
        self.at += n
        return chunk

    def tuple_data(self) -> tuple[Value, ...]:
        values, self.at = tuple_values(self.data, self.at)
        return tuple(values)


def tuple_values(data: bytes, at: int) -> tuple[list[Value], int]:
    """The TupleData at offset ``at`` of ``data``: its values and the offset after it."""
    (count,) = _INT16.unpack_from(data, at)
    at += 2
    values: list[Value] = []
    append = values.append
    size = len(data)
    length_at = _INT32.unpack_from
    for _ in range(count):
        kind = data[at]
        if kind == 0x74:  # 't': a length, then the text
            (length,) = length_at(data, at + 1)
            end = at + 5 + length
            if end > size or length < 0:
                raise ValueError("message ends inside a value")
            append(data[at + 5 : end].decode())
            at = end
        elif kind == 0x6E:  # 'n'
            append(None)
            at += 1
        elif kind == 0x75:  # 'u'
            append(UNCHANGED)
            at += 1
        else:  # 'b' (binary) is only sent when asked for
            raise ValueError(f"tuple value kind {bytes([kind])!r} not supported")
    return values, at


class Decoder:
    """Turns pgoutput messages, in order, into committed :class:`Transaction`\\ s; keeps the relations seen."""

    def __init__(self, slot: str, since: int = 0) -> None:
        self.slot, self.since = slot, since
        """Changes of transactions committed before LSN ``since`` are skipped undecoded (no row needs them)."""
        self.relations: dict[int, Relation] = {}
        self._open: Transaction | None = None

    @property
    def open(self) -> Transaction | None:
        """The transaction begun and not yet committed."""
        return self._open

    def transactions(self, messages: Iterable[bytes]) -> Iterator[Transaction]:
        """Every transaction whose Commit is among ``messages``, in commit order (the slot's order)."""
        for data in messages:
            done = self.feed(bytes(data))
            if done is not None:
                yield done

    def feed(self, data: bytes) -> Transaction | None:
        """Decode one message; the transaction it commits, if it is a Commit."""
        kind = data[:1]
        try:
            return self._feed(kind, _Reader(data[1:]))
        except DECODE_ERRORS as e:
            raise self.refusal(data, e) from e

    def refusal(self, data: bytes, e: Exception) -> CdcSourceError:
        """The error for message ``data`` that does not decode (``e``: why)."""
        return CdcSourceError(
            f"replication slot {self.slot}: cannot decode pgoutput message {data[:1]!r} ({len(data)} bytes): {e}"
        )

    def _feed(self, kind: bytes, r: _Reader) -> Transaction | None:
        if kind == b"B":
            final_lsn, commit_time, xid = r.take(">q"), r.take(">q"), r.take(">I")
            self._open = Transaction(xid, final_lsn, 0, commit_time + POSTGRES_EPOCH_MICROS)
        elif kind == b"C":
            txn = self._in_transaction(kind)
            r.take(">b")
            commit_lsn, end_lsn = r.take(">q"), r.take(">q")
            if commit_lsn != txn.commit_lsn:
                raise ValueError(f"Commit LSN {int_to_lsn(commit_lsn)} of a Begin at {int_to_lsn(txn.commit_lsn)}")
            txn.end_lsn, self._open = end_lsn, None
            return txn
        elif kind == b"R":
            self._relation(r)
        elif kind in (b"I", b"U", b"D"):
            txn = self._in_transaction(kind)
            if txn.commit_lsn >= self.since:
                txn.changes.append(self._change(kind, r))
        elif kind == b"T":
            txn = self._in_transaction(kind)
            count, _options = r.take(">i"), r.take(">b")
            txn.truncated.extend(self.known(r.take(">I")) for _ in range(count))
        elif kind in (b"O", b"Y", b"M"):
            pass  # origin, type and logical messages carry nothing a row needs
        elif kind in (b"S", b"E", b"c", b"A", b"P", b"K", b"r", b"p", b"b"):
            raise ValueError("streamed or two-phase transactions are never asked for")
        else:
            raise ValueError("unknown message type")
        return None

    def _in_transaction(self, kind: bytes) -> Transaction:
        if self._open is None:
            raise ValueError(f"{kind!r} outside a transaction")
        return self._open

    def _relation(self, r: _Reader) -> None:
        oid, namespace, name = r.take(">I"), r.string(), r.string()
        identity = chr(r.take(">b"))
        columns = []
        for _ in range(r.take(">h")):
            flags, column = r.take(">b"), r.string()
            columns.append(Column(column, r.take(">I"), r.take(">i"), bool(flags & 1)))
        self.relations[oid] = Relation(oid, namespace or "pg_catalog", name, identity, tuple(columns))

    def known(self, oid: int) -> Relation:
        if oid not in self.relations:
            raise ValueError(f"change of relation {oid} before its Relation message")
        return self.relations[oid]

    def _change(self, kind: bytes, r: _Reader) -> Change:
        relation = self.known(r.take(">I"))
        marker = r.raw(1)
        if kind == b"I":
            if marker != b"N":
                raise ValueError(f"Insert with tuple marker {marker!r}")
            return Change("insert", relation, r.tuple_data())
        if kind == b"D":
            row = r.tuple_data()
            if marker == b"K":  # the key columns only, in the relation's column positions
                return Change("delete", relation, row)
            return Change("delete", relation, row, row)
        old: tuple[Value, ...] | None = None
        before: tuple[Value, ...] | None = None
        if marker in (b"K", b"O"):
            before = r.tuple_data()
            old = before if marker == b"O" else None  # a whole old row only under REPLICA IDENTITY FULL
            marker = r.raw(1)
        if marker != b"N":
            raise ValueError(f"Update without a new tuple (marker {marker!r})")
        return Change("update", relation, r.tuple_data(), old, before)
