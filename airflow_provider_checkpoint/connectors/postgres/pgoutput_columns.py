"""pgoutput messages straight into the Arrow rows of :class:`~.cdc.PostgresCdcSource`: one pass, each value's
text appended to its column's list, no object per change (the rows :func:`.cdc_rows.change_rows` gives, by a
third of the work).

What it keeps of the message stream: the transactions whose commit LSN lies in ``[start, end)`` (known at
their Begin; the others' changes are skipped undecoded), each whole or not at all (a transaction without its
Commit leaves no row); with a snapshot ``seen``, two groups of rows, those of the transactions it sees, then
the others. Per transaction, in order: the rows of its changes (an update that changed the key first gives
the old key's delete); a TRUNCATE, an unchanged TOASTed value without the old row, or a change of a table
that is not the source's is refused as :mod:`.cdc_rows` says. Relation messages are followed: each row is
read with the columns of its relation's last Relation message.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.connectors.postgres.cdc_rows import arrow_columns, toast_refusal, truncate_refusal
from airflow_provider_checkpoint.connectors.postgres.cdc_schema import check_sent
from airflow_provider_checkpoint.connectors.postgres.cdc_types import TableColumn
from airflow_provider_checkpoint.connectors.postgres.pgoutput import (
    DECODE_ERRORS,
    UNCHANGED,
    Decoder,
    Relation,
    tuple_batch,
    tuple_values,
)
from airflow_provider_checkpoint.exceptions import CdcSourceError

if TYPE_CHECKING:
    import pyarrow as pa

_OID = struct.Struct(">I")
_OPS = {b"I": "insert", b"U": "update", b"D": "delete"}
_SIMPLE = {b"I": b"N", b"U": b"N", b"D": b"K"}
"""The tuple marker of a change with one tuple (no old row): an insert, an update of a row whose key did not
change (without REPLICA IDENTITY FULL), a delete by key."""


@dataclass
class _Group:
    """One group's rows: a text list per column, and per row its table and op; per transaction its commit
    LSN, time, id and row count."""

    texts: list[list[Any]]
    tables: list[str] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    txns: list[tuple[int, int, int, int]] = field(default_factory=list)

    def cut(self, rows: int) -> None:
        """Drop the rows after the first ``rows``."""
        for texts in self.texts:
            del texts[rows:]
        del self.tables[rows:], self.ops[rows:]


@dataclass
class _Shape:
    """How a relation's rows go into a group: each sent column's text list (``None``: not read), the lists
    of the columns it does not send, its key positions (an update that changes them moves the row)."""

    relation: Relation
    table: str
    into: list[Callable[[Any], None] | None]
    absent: list[Callable[[Any], None]]
    key: list[int]
    lists: list[list[Any] | None]
    """The text lists ``into`` appends to."""
    missing: list[list[Any]]
    """The text lists ``absent`` appends to."""


def decode_rows(
    uid: str,
    slot: str,
    messages: Iterable[bytes],
    columns: list[TableColumn],
    catalog: dict[str, dict[str, TableColumn]],
    span: tuple[int, int],
    seen: Callable[[int], bool] | None = None,
) -> list[pa.Table]:
    """The rows of the transactions committed in ``span``, as one table of ``columns`` then
    :data:`.cdc_rows.METADATA`, or with ``seen``, two: those of the transactions ``seen(xid)`` is true for,
    then the others."""
    groups = [_Group([[] for _ in columns]) for _ in range(1 if seen is None else 2)]
    _Rows(uid, Decoder(slot), columns, catalog, groups).run(messages, span, seen)
    return [arrow_columns(columns, g.texts, g.tables, g.ops, g.txns) for g in groups]


class _Rows:
    def __init__(
        self,
        uid: str,
        decoder: Decoder,
        columns: list[TableColumn],
        catalog: dict[str, dict[str, TableColumn]],
        groups: list[_Group],
    ) -> None:
        self.uid, self.decoder, self.columns, self.catalog, self.groups = uid, decoder, columns, catalog, groups
        self.shapes: dict[tuple[int, int], _Shape] = {}
        """By relation oid and group; a Relation message drops its oid's."""

    def run(self, messages: Iterable[bytes], span: tuple[int, int], seen: Callable[[int], bool] | None) -> None:
        """Every message in order: the control messages through :class:`.pgoutput.Decoder` (which keeps the
        open transaction and the relations), the row changes of transactions in ``span`` into their group."""
        start, end = span
        decoder = self.decoder
        group: int | None = None
        mark = 0
        pending: list[bytes] = []
        failed: CdcSourceError | None = None
        """The open transaction's first refused change: raised at its Commit (a transaction that does not
        commit in the messages has no rows and no error)."""
        for message in messages:
            data = bytes(message)
            kind = data[:1]
            txn = decoder.open
            if kind in _OPS and txn is not None:
                if group is not None and data[5:6] == _SIMPLE[kind]:  # one row, no old tuple: parsed in batches
                    pending.append(data)
                elif group is not None:
                    failed = failed or self._deferred(pending, group, data)
                continue
            if group is not None:
                failed = failed or self._deferred(pending, group)
            done = decoder.feed(data)
            if kind == b"B":
                txn = decoder.open
                assert txn is not None
                group, failed = None, None
                if start <= txn.commit_lsn < end:
                    group = 0 if seen is None or seen(txn.xid) else 1
                    mark = len(self.groups[group].ops)
            elif kind == b"R":
                for g in range(len(self.groups)):
                    self.shapes.pop((_OID.unpack_from(data, 1)[0], g), None)
            elif done is not None:  # a Commit
                if group is not None:
                    if done.truncated:
                        raise truncate_refusal(self.uid, done)
                    if failed is not None:
                        raise failed
                    rows = self.groups[group]
                    if len(rows.ops) > mark:
                        rows.txns.append((done.commit_lsn, done.commit_time_micros, done.xid, len(rows.ops) - mark))
                group = None
        if group is not None:  # a transaction without its Commit: none of its rows
            self.groups[group].cut(mark)
            pending.clear()

    def _deferred(self, pending: list[bytes], group: int, data: bytes = b"") -> CdcSourceError | None:
        """:meth:`_flush` of ``pending``, then :meth:`_change` of ``data`` (if any); the refusal they
        raise, returned."""
        try:
            self._flush(pending, group)
            if data:
                self._change(data[:1], data, group)
        except CdcSourceError as e:
            pending.clear()
            return e
        return None

    def _flush(self, pending: list[bytes], group: int) -> None:
        """The rows of ``pending`` (changes of one tuple, in order), parsed together by :func:`.tuple_batch`
        per run of one relation, or one by one (:meth:`_change`) where a batch does not parse (a value
        unchanged, a malformed message: its error)."""
        if not pending:
            return
        rows = self.groups[group]
        run: list[bytes] = []
        for data in [*pending, b""]:
            if run and (not data or data[:5] != run[0][:5]):
                shape = self._shape(_OID.unpack_from(run[0], 1)[0], group)
                columns = tuple_batch(run, len(shape.into))
                if columns is None:
                    for one in run:
                        self._change(one[:1], one, group)
                else:
                    for target, texts in zip(shape.lists, columns, strict=True):
                        if target is not None:
                            target.extend(texts)
                    for target in shape.missing:
                        target.extend([None] * len(run))
                    rows.tables.extend([shape.table] * len(run))
                    rows.ops.extend([_OPS[run[0][:1]]] * len(run))
                run = []
            run.append(data)
        pending.clear()

    def _shape(self, oid: int, group: int) -> _Shape:
        shape = self.shapes.get((oid, group))
        if shape is not None:
            return shape
        relation = self.decoder.known(oid)
        if relation.qualified not in self.catalog:
            raise CdcSourceError(
                f"source {self.uid}: a change of table {relation.qualified}, which is not among the source's tables"
            )
        known = self.catalog[relation.qualified]
        texts = {c.name: t for c, t in zip(self.columns, self.groups[group].texts, strict=True)}
        lists = [
            texts[c.name] if check_sent(self.uid, known, c.name, c.type_oid, c.type_modifier) else None
            for c in relation.columns
        ]
        sent = {c.name for c, t in zip(relation.columns, lists, strict=True) if t is not None}
        primary = [i for i, c in enumerate(relation.columns) if c.name in known and known[c.name].key]
        identity = [i for i, c in enumerate(relation.columns) if c.key] if relation.replica_identity == "i" else []
        missing = [t for name, t in texts.items() if name not in sent]
        into = [None if t is None else t.append for t in lists]
        absent = [t.append for t in missing]
        key = primary or identity
        shape = self.shapes[(oid, group)] = _Shape(relation, relation.qualified, into, absent, key, lists, missing)
        return shape

    def _change(self, kind: bytes, data: bytes, group: int) -> None:
        before: list[Any] | None = None
        try:
            shape = self._shape(_OID.unpack_from(data, 1)[0], group)
            marker, at = data[5:6], 6
            if kind == b"U" and marker in (b"K", b"O"):
                before, at = tuple_values(data, at)
                marker, at = data[at : at + 1], at + 1
            if kind == b"I" and marker != b"N":
                raise ValueError(f"Insert with tuple marker {marker!r}")
            if kind == b"U" and marker != b"N":
                raise ValueError(f"Update without a new tuple (marker {marker!r})")
            values, at = tuple_values(data, at)
        except DECODE_ERRORS as e:
            raise self.decoder.refusal(data, e) from e
        first = data[5:6]  # a whole old row (REPLICA IDENTITY FULL) fills an unchanged TOASTed value
        old = before if first == b"O" else values if kind == b"D" and first != b"K" else None
        rows, relation = self.groups[group], shape.relation
        moved = before is not None and any(v is not UNCHANGED and v != before[i] for i, v in _at(values, shape.key))
        if moved and before is not None:  # the old key's row goes, as a delete
            self._row(shape, rows, [None if v is UNCHANGED else v for v in before], "delete")
        if UNCHANGED in values:
            for i, value in enumerate(values):
                if value is UNCHANGED:
                    if old is None:
                        raise toast_refusal(self.uid, relation.qualified, relation.columns[i].name)
                    values[i] = old[i]
        self._row(shape, rows, values, _OPS[kind])

    @staticmethod
    def _row(shape: _Shape, rows: _Group, values: list[Any], op: str) -> None:
        for append, value in zip(shape.into, values, strict=True):
            if append is not None:
                append(value)
        for append in shape.absent:
            append(None)
        rows.tables.append(shape.table)
        rows.ops.append(op)


def _at(values: list[Any], positions: list[int]) -> Iterator[tuple[int, Any]]:
    return ((i, values[i]) for i in positions)
