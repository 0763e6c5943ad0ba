"""The chunked, resumable initial snapshot of :class:`~.cdc.PostgresCdcSource` (``snapshot_chunk_rows``).

Each checkpoint's trigger, after recording its barrier ``B``, reads the next chunk: the next ``rows`` keys of
one table in primary-key order after the last key read (one ``COPY``), in a ``REPEATABLE READ`` transaction
whose snapshot (``pg_current_snapshot()``: xmin, xmax, in-progress ids) is kept with the chunk. The step then
emits the span's transactions that snapshot sees (their effect is in the chunk), the chunk, then the span's
other transactions (committed before ``B`` but not yet visible: visibility is not ordered by commit LSN).
Changes after ``B`` follow in later checkpoints; those the chunk already holds are re-applied, harmless for an
upsert sink since pgoutput sends whole rows, and for one row the order holds (a later change of a row waits
for the earlier one's row lock, released only once that transaction is visible).

The position records where the next chunk starts (``snapshot_cursor``: a table and the last key read, as
text) and the chunk a checkpoint reads (``chunk``: its file and snapshot); both come back from storage and
are validated before use.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.connectors.postgres.cdc_snapshot import copy_texts, select_texts, snapshot_rows
from airflow_provider_checkpoint.connectors.postgres.cdc_types import (
    SESSION,
    TableColumn,
    quote,
    quoted_table,
    table_columns,
)
from airflow_provider_checkpoint.exceptions import CdcSourceError, InvalidPositionError
from airflow_provider_checkpoint.storage.job_storage import SOURCES_DIR

if TYPE_CHECKING:
    import pyarrow as pa

_XID = 1 << 32
_PRIMARY_KEY = """
SELECT a.attname FROM pg_index i
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = %s::regclass AND i.indisprimary ORDER BY k.n
"""


@dataclass(frozen=True)
class Snapshot:
    """A transaction snapshot as ``pg_current_snapshot()`` gives it (64-bit ids)."""

    xmin: int
    xmax: int
    xip: frozenset[int]

    @classmethod
    def parse(cls, text: str) -> Snapshot:
        """``'xmin:xmax:xip,…'``; :class:`ValueError` if it is not one."""
        xmin, xmax, xip = text.split(":")
        snapshot = cls(int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x))
        if not 0 < snapshot.xmin <= snapshot.xmax or not all(snapshot.xmin <= x < snapshot.xmax for x in snapshot.xip):
            raise ValueError(text)
        return snapshot

    def text(self) -> str:
        return f"{self.xmin}:{self.xmax}:{','.join(str(x) for x in sorted(self.xip))}"

    def sees(self, xid: int) -> bool:
        """Whether a committed transaction of 32-bit id ``xid`` (pgoutput's) is visible in the snapshot. Every
        transaction committed before the barrier started before the snapshot, so its id is below ``xmax``."""
        full = (self.xmax & ~(_XID - 1)) | xid
        if full >= self.xmax:
            full -= _XID
        return full < self.xmin or (full < self.xmax and full not in self.xip)


@dataclass(frozen=True)
class Cursor:
    """Where the next chunk starts: after key ``after`` (texts, in key order; ``None``: the first) of
    ``table``."""

    table: str
    after: list[str] | None

    def to_json(self) -> dict[str, Any]:
        return {"table": self.table, "after": self.after}


@dataclass(frozen=True)
class Chunk:
    """The chunk a checkpoint reads: its Parquet file in the job's storage and the snapshot it was read in."""

    file: str
    snapshot: Snapshot
    rows: int

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "snapshot": self.snapshot.text(), "rows": self.rows}


def chunk_dir(uid: str) -> str:
    return f"{SOURCES_DIR}/{uid}/chunks"


def primary_key(conn: Any, uid: str, table: str) -> list[str]:
    """``table``'s primary key columns in index order; :class:`CdcSourceError` if it has none."""
    names = [str(r[0]) for r in conn.execute(_PRIMARY_KEY, (quoted_table(table),)).fetchall()]
    if not names:
        raise CdcSourceError(
            f"source {uid}: table {table} has no primary key: the chunked snapshot (snapshot_chunk_rows) reads a "
            f"table in primary-key order; add a primary key to {table}, or leave snapshot_chunk_rows unset (one "
            "snapshot of every table in the first checkpoint)"
        )
    return names


def read_chunk(
    pg_conn: Any, uid: str, cursor: Cursor, columns: list[TableColumn], rows: int, lsn: int
) -> tuple[pa.Table, Snapshot, Cursor | None]:
    """The next chunk of ``cursor.table`` (at most ``rows`` rows after ``cursor.after``) as snapshot rows
    (``lsn``), the snapshot it was read in, and the table's cursor after it (``None``: the table is read)."""
    from psycopg import sql

    with pg_conn.connect() as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        (text,) = conn.execute("SELECT pg_current_snapshot()::text").fetchone()  # fixes the snapshot
        conn.execute(SESSION)
        keys = primary_key(conn, uid, cursor.table)
        present = {c.name for c in table_columns(conn, cursor.table)}
        columns = [c for c in columns if c.name in present]  # a column dropped since is null in the chunk
        types = {c.name: c.type_name for c in columns}
        if any(k not in types for k in keys):
            raise CdcSourceError(f"source {uid}: primary key {keys} of {cursor.table} is not among its columns")
        # qualified: a bare name in ORDER BY would be the output column (its ::text), ordered as text
        order = ", ".join(f"{quoted_table(cursor.table)}.{quote(k)}" for k in keys)
        where = ""
        if cursor.after is not None:
            if len(cursor.after) != len(keys):
                raise InvalidPositionError(
                    f"source {uid}: snapshot cursor {cursor.to_json()} does not match primary key {keys}"
                )
            bound = sql.SQL(", ").join(
                sql.SQL("{}::{}").format(sql.Literal(v), sql.SQL(types[k]))  # type: ignore[arg-type]
                for k, v in zip(keys, cursor.after, strict=True)
            )
            where = sql.SQL(" WHERE ({}) > ({})").format(sql.SQL(order), bound).as_string(conn)  # type: ignore[arg-type]
        query = f"{select_texts(cursor.table, columns)}{where} ORDER BY {order} LIMIT {int(rows)}"
        texts = copy_texts(conn, query, len(columns))
        conn.rollback()
    snapshot = Snapshot.parse(str(text))
    read = 0 if texts is None else texts.num_rows
    if texts is None or read < rows:
        return snapshot_rows(cursor.table, columns, texts, lsn), snapshot, None
    positions = [f"c{[c.name for c in columns].index(k)}" for k in keys]
    last = [str(texts[p][read - 1].as_py()) for p in positions]
    return snapshot_rows(cursor.table, columns, texts, lsn), snapshot, Cursor(cursor.table, last)


def new_chunk_file(uid: str) -> str:
    return f"{chunk_dir(uid)}/{uuid.uuid4().hex}.parquet"


def parse_cursor(uid: str, value: Any, tables: list[str]) -> Cursor | None:
    """A position's ``snapshot_cursor`` (``None``: the snapshot is finished), validated."""
    if value is None:
        return None
    after = value.get("after") if isinstance(value, dict) else None
    if (
        not isinstance(value, dict)
        or set(value) != {"table", "after"}
        or value["table"] not in tables
        or not (after is None or (isinstance(after, list) and after and all(isinstance(a, str) for a in after)))
    ):
        raise InvalidPositionError(f"source {uid}: snapshot_cursor {value!r} is not a cursor of tables {tables}")
    return Cursor(str(value["table"]), None if after is None else [str(a) for a in after])


def parse_chunk(uid: str, value: Any) -> Chunk:
    """A position's ``chunk``, validated: its file must be one of the source's chunk files."""
    try:
        if not isinstance(value, dict) or set(value) != {"file", "snapshot", "rows"}:
            raise ValueError("fields")
        file, rows = value["file"], value["rows"]
        if not isinstance(file, str) or not re.fullmatch(rf"{re.escape(chunk_dir(uid))}/[0-9a-f]{{32}}\.parquet", file):
            raise ValueError("file")
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
            raise ValueError("rows")
        return Chunk(file, Snapshot.parse(str(value["snapshot"])), rows)
    except (ValueError, TypeError) as e:
        raise InvalidPositionError(f"source {uid}: chunk {value!r} is not a snapshot chunk ({e})") from e
