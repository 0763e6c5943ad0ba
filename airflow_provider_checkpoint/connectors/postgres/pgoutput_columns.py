"""pgoutput messages straight into the Arrow rows of :class:`~.cdc.PostgresCdcSource`, no object per change
(the rows the changes of decoded :class:`.pgoutput.Transaction`\\ s give, one at a time).

What it keeps of the message stream: the transactions whose commit LSN lies in ``[start, end)`` (known at
their Begin; the others' changes are skipped undecoded), each whole or not at all (a transaction without its
Commit leaves no row); with a snapshot ``seen``, two groups of rows, those of the transactions it sees, then
the others. Per transaction, in order: the rows of its changes (an update that changed the key first gives
the old key's delete); a TRUNCATE, an unchanged TOASTed value without the old row, or a change of a table
that is not the source's is refused as :mod:`.cdc_rows` says (the refusal the stream meets first, in message
order, once its transaction commits). Relation messages are followed: each row is read with the columns of
its relation's last Relation message.

How: the messages come in one buffer (:class:`.pgoutput_batch.Messages`). Python reads the control messages
(Begin, Commit, Relation, ...) and the changes of more than one tuple one by one; the changes of one tuple
(inserts, updates that keep the key, deletes by key: nearly all) are kept as runs of message positions per
relation shape, across transactions, and parsed together at the end (:func:`.pgoutput_batch.tuple_columns`);
a run that does not parse so is decoded one message at a time (its error, or its rows).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from airflow_provider_checkpoint.connectors.postgres.cdc_rows import arrow_columns, toast_refusal, truncate_refusal
from airflow_provider_checkpoint.connectors.postgres.cdc_schema import check_sent
from airflow_provider_checkpoint.connectors.postgres.cdc_types import TableColumn
from airflow_provider_checkpoint.connectors.postgres.pgoutput import (
    DECODE_ERRORS,
    UNCHANGED,
    Decoder,
    Relation,
    Transaction,
    tuple_values,
)
from airflow_provider_checkpoint.connectors.postgres.pgoutput_batch import (
    Messages,
    decoded_codes,
    positions,
    tuple_columns,
)
from airflow_provider_checkpoint.exceptions import CdcSourceError
from airflow_provider_checkpoint.fileio.arrow_numpy import strings_of

if TYPE_CHECKING:
    import pyarrow as pa

_OID = struct.Struct(">I")
OPS = ("insert", "update", "delete")
_INSERT, _UPDATE, _DELETE = range(3)
_CODES = {b"I": _INSERT, b"U": _UPDATE, b"D": _DELETE}
_KIND_CODES = np.zeros(256, np.int8)
_KIND_CODES[ord("U")], _KIND_CODES[ord("D")] = _UPDATE, _DELETE

Key = tuple[int, int, int]
"""Where a refusal is raised in message order: the position of its transaction's Commit (of the message, for
a message that does not decode), then 0 for a TRUNCATE, 1 for a change, then the change's position."""


@dataclass
class _Shape:
    """How a relation's rows go into the rows: per sent column, the column it fills (``None``: not read);
    the columns it does not send; its key positions (an update that changes them moves the row)."""

    relation: Relation
    table: int
    """The table's position in :attr:`_Rows.tables`."""
    targets: list[int | None]
    missing: list[int]
    key: list[int]


@dataclass
class _Runs:
    """Changes of one tuple of one shape: message positions ``[starts[i], stops[i])``, each run of the
    transaction committed at ``commits[i]``."""

    shape: _Shape
    starts: list[int]
    stops: list[int]
    commits: list[int] = field(default_factory=list)


@dataclass
class _Decoded:
    """Rows of one shape decoded one message at a time: values in the relation's column order, op codes."""

    shape: _Shape
    values: list[list[Any]] = field(default_factory=list)
    ops: list[int] = field(default_factory=list)


@dataclass
class _Parsed:
    shape: _Shape
    arrays: list[pa.Array | None]
    """Per sent column (``None`` where not read)."""
    ops: np.ndarray


@dataclass
class _Group:
    parts: list[_Runs | _Decoded] = field(default_factory=list)
    txns: list[tuple[int, int, int, int]] = field(default_factory=list)
    """Per transaction, in row order: its commit LSN, time, id and row count."""


def decode_rows(
    uid: str,
    slot: str,
    messages: Messages | Iterable[bytes],
    columns: list[TableColumn],
    catalog: dict[str, dict[str, TableColumn]],
    span: tuple[int, int],
    seen: Callable[[int], bool] | None = None,
) -> list[pa.Table]:
    """The rows of the transactions committed in ``span``, as one table of ``columns`` then
    :data:`.cdc_rows.METADATA`, or with ``seen``, two: those of the transactions ``seen(xid)`` is true for,
    then the others."""
    msgs = messages if isinstance(messages, Messages) else Messages.of(messages)
    rows = _Rows(uid, Decoder(slot), columns, catalog, 1 if seen is None else 2)
    rows.run(msgs, span, seen)
    return rows.tables(msgs)


class _Rows:
    def __init__(
        self,
        uid: str,
        decoder: Decoder,
        columns: list[TableColumn],
        catalog: dict[str, dict[str, TableColumn]],
        groups: int,
    ) -> None:
        self.uid, self.decoder, self.columns, self.catalog = uid, decoder, columns, catalog
        self.groups = [_Group() for _ in range(groups)]
        self.shapes: dict[int, _Shape] = {}
        """By relation oid; a Relation message drops its oid's."""
        self.tables_named: list[str] = []
        self.errors: list[tuple[Key, CdcSourceError]] = []
        self.committed: Transaction | None = None
        """What the last message fed to the decoder committed."""

    def run(self, msgs: Messages, span: tuple[int, int], seen: Callable[[int], bool] | None) -> None:
        """Every message in order: the control messages through :class:`.pgoutput.Decoder` (which keeps the
        open transaction and the relations), the row changes of transactions in ``span`` into their group's
        parts at their Commit. Stops at the first refusal (:attr:`errors`)."""
        start, end = span
        decoder = self.decoder
        group: int | None = None
        parts: list[_Runs | _Decoded] = []
        failed: tuple[int, CdcSourceError] | None = None
        """The open transaction's first refused change (a transaction that does not commit has no error)."""
        previous = 0
        for p in [*np.flatnonzero(~msgs.changes).tolist(), len(msgs)]:
            if previous < p and decoder.open is None:  # a change outside a transaction: the decoder refuses it
                self._refused((previous, 0, 0), msgs.message(previous))
                return
            if previous < p and group is not None:
                failed = self._changes(msgs, previous, p, parts, failed)
            previous = p + 1
            if p == len(msgs):
                return
            data = msgs.message(p)
            kind = data[:1]
            if self._refused((p, 0, 0), data):
                return
            if kind == b"B":
                txn = decoder.open
                assert txn is not None
                group, parts, failed = None, [], None
                if start <= txn.commit_lsn < end:
                    group = 0 if seen is None or seen(txn.xid) else 1
            elif kind == b"R":
                self.shapes.pop(_OID.unpack_from(data, 1)[0], None)
            elif kind == b"C" and group is not None:
                done = self.committed
                assert done is not None
                if done.truncated:
                    self.errors.append(((p, 0, 0), truncate_refusal(self.uid, done)))
                    return
                self._commit(self.groups[group], parts, p)
                if failed is not None:
                    self.errors.append(((p, 1, failed[0]), failed[1]))
                    return
                group = None
            elif kind == b"C":
                group = None

    def _refused(self, key: Key, data: bytes) -> bool:
        """Feed ``data`` to the decoder; whether it refused it (its error kept)."""
        try:
            self.committed = self.decoder.feed(data)
        except CdcSourceError as e:
            self.errors.append((key, e))
            return True
        return False

    def _commit(self, group: _Group, parts: list[_Runs | _Decoded], at: int) -> None:
        """The committed transaction's ``parts`` (its Commit at position ``at``) into ``group``."""
        rows = 0
        for part in parts:
            last = group.parts[-1] if group.parts else None
            if isinstance(part, _Runs):
                part.commits = [at] * len(part.starts)
                rows += sum(part.stops) - sum(part.starts)
                if isinstance(last, _Runs) and last.shape is part.shape:
                    last.starts += part.starts
                    last.stops += part.stops
                    last.commits += part.commits
                    continue
            else:
                rows += len(part.ops)
                if isinstance(last, _Decoded) and last.shape is part.shape:
                    last.values += part.values
                    last.ops += part.ops
                    continue
            group.parts.append(part)
        if rows:
            txn = self.committed
            assert txn is not None
            group.txns.append((txn.commit_lsn, txn.commit_time_micros, txn.xid, rows))

    def _changes(
        self,
        msgs: Messages,
        start: int,
        stop: int,
        parts: list[_Runs | _Decoded],
        failed: tuple[int, CdcSourceError] | None,
    ) -> tuple[int, CdcSourceError] | None:
        """The changes at positions ``[start, stop)`` of the open transaction into its ``parts``: runs of one
        tuple as positions, the others decoded; the first refused change (``failed`` if already one)."""
        simple, oids, stops = msgs.simple, msgs.oids, msgs.run_stops
        i = start
        while i < stop:
            last = parts[-1] if parts else None
            j = min(int(stops[i]), stop) if simple[i] else i + 1
            try:
                if simple[i]:
                    oid = int(oids[i])
                    shape = self.shapes.get(oid) or self._shape(oid, msgs.message(i))
                    if isinstance(last, _Runs) and last.shape is shape:
                        last.starts.append(i)
                        last.stops.append(j)
                    else:
                        parts.append(_Runs(shape, [i], [j]))
                else:
                    shape, values, ops = self._change(msgs.message(i))
                    if isinstance(last, _Decoded) and last.shape is shape:
                        target = last
                    else:
                        parts.append(target := _Decoded(shape))
                    target.values += values
                    target.ops += ops
            except CdcSourceError as e:
                failed = failed or (i, e)
            i = j
        return failed

    def _shape(self, oid: int, data: bytes) -> _Shape:
        """The shape of relation ``oid``'s rows (``data``: a change of it, named in a refusal)."""
        shape = self.shapes.get(oid)
        if shape is not None:
            return shape
        try:
            relation = self.decoder.known(oid)
        except ValueError as e:
            raise self.decoder.refusal(data, e) from e
        if relation.qualified not in self.catalog:
            raise CdcSourceError(
                f"source {self.uid}: a change of table {relation.qualified}, which is not among the source's tables"
            )
        known = self.catalog[relation.qualified]
        position = {c.name: j for j, c in enumerate(self.columns)}
        targets = [
            position[c.name] if check_sent(self.uid, known, c.name, c.type_oid, c.type_modifier) else None
            for c in relation.columns
        ]
        sent = {j for j in targets if j is not None}
        primary = [i for i, c in enumerate(relation.columns) if c.name in known and known[c.name].key]
        identity = [i for i, c in enumerate(relation.columns) if c.key] if relation.replica_identity == "i" else []
        if relation.qualified not in self.tables_named:
            self.tables_named.append(relation.qualified)
        table = self.tables_named.index(relation.qualified)
        missing = [j for j in range(len(self.columns)) if j not in sent]
        shape = self.shapes[oid] = _Shape(relation, table, targets, missing, primary or identity)
        return shape

    def _change(self, data: bytes) -> tuple[_Shape, list[list[Any]], list[int]]:
        """One change message decoded: its shape, its rows' values and op codes (an update that moved the key:
        the old key's delete first)."""
        kind = data[:1]
        before: list[Any] | None = None
        try:
            shape = self._shape(_OID.unpack_from(data, 1)[0], data)
            width = len(shape.targets)
            marker, at = data[5:6], 6
            if kind == b"U" and marker in (b"K", b"O"):
                before, at = _tuple(data, at, width)
                marker, at = data[at : at + 1], at + 1
            if kind == b"I" and marker != b"N":
                raise ValueError(f"Insert with tuple marker {marker!r}")
            if kind == b"U" and marker != b"N":
                raise ValueError(f"Update without a new tuple (marker {marker!r})")
            values, at = _tuple(data, at, width)
        except DECODE_ERRORS as e:
            raise self.decoder.refusal(data, e) from e
        first = data[5:6]  # a whole old row (REPLICA IDENTITY FULL) fills an unchanged TOASTed value
        old = before if first == b"O" else values if kind == b"D" and first != b"K" else None
        rows, ops = [], []
        if before is not None and any(values[i] is not UNCHANGED and values[i] != before[i] for i in shape.key):
            rows.append([None if v is UNCHANGED else v for v in before])  # the old key's row goes, as a delete
            ops.append(_DELETE)
        if UNCHANGED in values:
            for i, value in enumerate(values):
                if value is UNCHANGED:
                    if old is None:
                        relation = shape.relation
                        raise toast_refusal(self.uid, relation.qualified, relation.columns[i].name)
                    values[i] = old[i]
        rows.append(values)
        ops.append(_CODES[kind])
        return shape, rows, ops

    def tables(self, msgs: Messages) -> list[pa.Table]:
        """Each group's rows; the first refusal (in message order) raised."""
        parsed = [[self._parse(msgs, part) for part in group.parts] for group in self.groups]
        if self.errors:
            raise min(self.errors, key=lambda e: e[0])[1]
        return [
            self._table(group, [p for p in done if p is not None])
            for group, done in zip(self.groups, parsed, strict=True)
        ]

    def _parse(self, msgs: Messages, part: _Runs | _Decoded) -> _Parsed | None:
        """A part's columns as string arrays; ``None`` if a change of it is refused (its error kept)."""
        import pyarrow as pa

        shape = part.shape
        if isinstance(part, _Runs):
            index = positions(part.starts, part.stops)
            arrays = tuple_columns(msgs, index, len(shape.targets))
            if arrays is not None:
                kept: list[pa.Array | None] = [
                    a if t is not None else None for a, t in zip(arrays, shape.targets, strict=True)
                ]
                return _Parsed(shape, kept, _KIND_CODES[msgs.kinds[index]])
            decoded = _Decoded(shape)
            for start, stop, commit in zip(part.starts, part.stops, part.commits, strict=True):
                for i in range(start, stop):
                    try:
                        _, values, ops = self._change(msgs.message(i))
                    except CdcSourceError as e:
                        self.errors.append(((commit, 1, i), e))
                        return None
                    decoded.values += values
                    decoded.ops += ops
            part = decoded
        texts = [
            None if t is None else pa.array([v[i] for v in part.values], pa.large_string())
            for i, t in enumerate(shape.targets)
        ]
        return _Parsed(shape, texts, np.array(part.ops, np.int8))

    def _table(self, group: _Group, parsed: list[_Parsed]) -> pa.Table:
        import pyarrow as pa

        chunks: list[list[pa.Array]] = [[] for _ in self.columns]
        for part in parsed:
            for j, array in zip(part.shape.targets, part.arrays, strict=True):
                if j is not None and array is not None:
                    chunks[j].append(array)
            for j in part.shape.missing:
                chunks[j].append(pa.nulls(len(part.ops), pa.large_string()))
        texts = [pa.concat_arrays(c).cast(pa.string()) if c else strings_of([]) for c in chunks]
        ops = np.concatenate([p.ops for p in parsed]) if parsed else np.zeros(0, np.int8)
        tables = np.concatenate(
            [np.full(len(p.ops), p.shape.table, np.int32) for p in parsed] or [np.zeros(0, np.int32)]
        )
        return arrow_columns(
            self.columns, texts, decoded_codes(tables, self.tables_named), decoded_codes(ops, list(OPS)), group.txns
        )


def _tuple(data: bytes, at: int, width: int) -> tuple[list[Any], int]:
    """:func:`.pgoutput.tuple_values` of a relation of ``width`` columns (another count is refused)."""
    values, at = tuple_values(data, at)
    if len(values) != width:
        raise ValueError(f"a tuple of {len(values)} values for a relation of {width} columns")
    return values, at
