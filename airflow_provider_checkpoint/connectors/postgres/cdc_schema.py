"""Schema changes of captured tables: the columns a :class:`~.cdc.PostgresCdcSource` position records per
table, how a DDL (added, dropped or retyped column) moves them, and how a row of any shape the WAL holds is
read against them.

The recorded columns only grow: an added column is appended (null in every earlier row); a dropped column
stays (null from then on); a retyped column takes the new type when it only widens (every old value keeps
its meaning in it), else the change is refused naming the table, the column and both types.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_checkpoint.connectors.postgres.cdc_types import TableColumn, quoted_table
from airflow_provider_checkpoint.exceptions import CdcSourceError, InvalidPositionError

INT2, INT4, INT8, FLOAT4, FLOAT8, NUMERIC = 21, 23, 20, 700, 701, 1700
TEXT, VARCHAR, BPCHAR = 25, 1043, 1042
_NAMES = {
    INT2: "smallint",
    INT4: "integer",
    INT8: "bigint",
    FLOAT4: "real",
    FLOAT8: "double precision",
    NUMERIC: "numeric",
    TEXT: "text",
    VARCHAR: "character varying",
    BPCHAR: "character",
}
_WIDER = {INT2: {INT4, INT8, NUMERIC}, INT4: {INT8, NUMERIC}, INT8: {NUMERIC}, FLOAT4: {FLOAT8}}
SAFE = "int2 → int4 → int8 (→ numeric), float4 → float8, varchar(n)/char(n) → longer or text, numeric(p,s) → wider"


def to_json(columns: list[TableColumn]) -> list[list[Any]]:
    """The columns of one table as a position records them."""
    return [[c.name, c.type_oid, c.type_modifier, c.type_name, c.key] for c in columns]


def from_json(uid: str, table: str, value: Any) -> list[TableColumn]:
    try:
        return [TableColumn(table, str(n), int(o), int(m), str(t), bool(k)) for n, o, m, t, k in value]
    except (TypeError, ValueError) as e:
        raise InvalidPositionError(f"source {uid}: recorded columns {value!r} of table {table} are not columns") from e


def _numeric_widens(old: TableColumn, new: TableColumn) -> bool:
    if new.type_modifier < 4:
        return False  # unbounded numeric: refused by the type conversion anyway
    if old.type_oid != NUMERIC:  # an integer: needs its digits before the point
        digits = {INT2: 5, INT4: 10, INT8: 19}[old.type_oid]
        precision, scale = new.numeric_bounds()
        return precision - scale >= digits
    if old.type_modifier < 4:
        return False
    (p, s), (q, t) = old.numeric_bounds(), new.numeric_bounds()
    return t >= s and q - t >= p - s


def widens(old: TableColumn, new: TableColumn) -> bool:
    """Whether every value of ``old``'s type is the same value in ``new``'s type (equal types too)."""
    if (old.type_oid, old.type_modifier) == (new.type_oid, new.type_modifier):
        return True
    if new.type_oid == NUMERIC and old.type_oid in (INT2, INT4, INT8, NUMERIC):
        return _numeric_widens(old, new)
    if new.type_oid in _WIDER.get(old.type_oid, ()):
        return True
    if old.type_oid in (VARCHAR, BPCHAR, TEXT) and new.type_oid in (VARCHAR, TEXT):
        # a shorter bound never widens; char(n) pads with blanks, which text and varchar keep as sent
        unbounded = new.type_modifier < 0 or new.type_oid == TEXT
        return unbounded or (old.type_modifier >= 0 and new.type_modifier >= old.type_modifier)
    return False


def type_name(type_oid: int, modifier: int) -> str:
    """A type the WAL gives as oid and modifier, named as ``format_type`` names it (types that widen)."""
    name = _NAMES.get(type_oid, f"type oid {type_oid}")
    if modifier < 0:
        return name
    if type_oid == NUMERIC:
        return f"{name}({(modifier - 4) >> 16},{(modifier - 4) & 0xFFFF})"
    return f"{name}({modifier - 4})" if type_oid in (VARCHAR, BPCHAR) else name


def refusal(uid: str, old: TableColumn, new: TableColumn) -> CdcSourceError:
    return CdcSourceError(
        f"source {uid}: {old.where()} changed type from {old.type_name} to {new.type_name}, which is not a "
        f"widening the sinks can follow (safe: {SAFE}); change it back (ALTER TABLE {old.table} ALTER COLUMN "
        f"{old.name} TYPE {old.type_name}), or capture the table anew (a new job: a new snapshot)"
    )


def evolve(uid: str, known: list[TableColumn], now: list[TableColumn], prefilled: set[str]) -> list[TableColumn]:
    """``known`` (a table's recorded columns) followed to ``now`` (its columns in the catalog): added
    columns appended, dropped ones kept, widened ones retyped; a type change that does not widen raises, and
    so does an added column in ``prefilled`` (the existing rows hold its default, which no WAL record sent)."""
    current = {c.name: c for c in now}
    kept = []
    for column in known:
        new = current.get(column.name)
        if new is None or (new.type_oid, new.type_modifier) == (column.type_oid, column.type_modifier):
            kept.append(column)
        elif widens(column, new):
            kept.append(new)
        else:
            raise refusal(uid, column, new)
    names = {c.name for c in known}
    added = [c for c in now if c.name not in names]
    for column in added:
        if column.name in prefilled:
            raise CdcSourceError(
                f"source {uid}: {column.where()} was added with a default, which PostgreSQL gives the existing rows "
                "without a change in the WAL: the target's copies of those rows would hold null. Add a column in "
                f"two statements (ADD COLUMN {column.name} {column.type_name}, then ALTER COLUMN {column.name} SET "
                "DEFAULT …) and fill the existing rows with UPDATEs; to go on now, capture the table anew (a new "
                "job: a new snapshot, into emptied targets)"
            )
    return kept + added


def prefilled(conn: Any, table: str) -> set[str]:
    """The columns of ``table`` whose value in rows older than the column is a stored default
    (``atthasmissing``: ``ADD COLUMN … DEFAULT``), not a null."""
    rows = conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND atthasmissing AND NOT attisdropped",
        (quoted_table(table),),
    ).fetchall()
    return {str(r[0]) for r in rows}


def check_sent(uid: str, known: dict[str, TableColumn], name: str, type_oid: int, modifier: int) -> bool:
    """Whether a value of column ``name`` the WAL sent (with that type) is read into the recorded column
    (``False``: the column was dropped before the checkpoint's barrier, so no recorded state has it); a
    type the recorded one does not widen raises."""
    column = known.get(name)
    if column is None:
        return False
    sent = TableColumn(column.table, name, type_oid, modifier, type_name(type_oid, modifier), column.key)
    if not widens(sent, column):
        raise refusal(uid, sent, column)
    return True
