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

import logging
import re
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.connectors.postgres import cdc_schema
from airflow_provider_checkpoint.connectors.postgres.cdc_rows import parquet
from airflow_provider_checkpoint.connectors.postgres.cdc_snapshot import copy_texts, select_texts, snapshot_rows
from airflow_provider_checkpoint.connectors.postgres.cdc_types import (
    SESSION,
    TableColumn,
    quote,
    quoted_table,
    table_columns,
)
from airflow_provider_checkpoint.connectors.postgres.pgoutput import lsn_to_int
from airflow_provider_checkpoint.core.faults import fault_point
from airflow_provider_checkpoint.exceptions import CdcSourceError, InvalidPositionError, SinkUnavailableError
from airflow_provider_checkpoint.storage.job_storage import SOURCES_DIR

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_provider_checkpoint.storage import JobStorage

log = logging.getLogger(__name__)

DEFAULT_CHUNK_ROWS = 100_000
"""Rows per chunk of a chunked snapshot that a source without ``snapshot_chunk_rows`` (removed mid-snapshot)
goes on with."""
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
        """Whether a committed transaction of 32-bit id ``xid`` (pgoutput's) is visible in the snapshot. The id
        is placed as PostgreSQL compares ids (modulo 2^32, the half before ``xmax`` in the past): at or after
        ``xmax`` it started after the snapshot."""
        ahead = (xid - self.xmax) % _XID
        if ahead < _XID // 2:
            return False
        full = self.xmax - (_XID - ahead)
        return full < self.xmin or full not in self.xip


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
    (``lsn``), the snapshot it was read in, and the table's cursor after it (``None``: the table is read).
    The server lost meanwhile (a crash, a restart) raises :class:`SinkUnavailableError` (retried)."""
    import psycopg

    try:
        return _read_chunk(pg_conn, uid, cursor, columns, rows, lsn)
    except psycopg.OperationalError as e:
        lines = str(e).strip().splitlines()
        raise SinkUnavailableError(
            f"source {uid}: PostgreSQL went away while reading the snapshot chunk of {cursor.table} after key "
            f"{cursor.after} ({lines[0] if lines else type(e).__name__}); nothing was recorded: the next checkpoint "
            "reads this chunk again"
        ) from e


def _read_chunk(
    pg_conn: Any, uid: str, cursor: Cursor, columns: list[TableColumn], rows: int, lsn: int
) -> tuple[pa.Table, Snapshot, Cursor | None]:
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
        fault_point("trigger.chunk_read", source=uid, table=cursor.table)
        texts = copy_texts(conn, query, len(columns), uid, cursor.table)
        conn.rollback()
    snapshot = Snapshot.parse(str(text))
    read = 0 if texts is None else texts.num_rows
    if texts is None or read < rows:
        return snapshot_rows(cursor.table, columns, texts, lsn), snapshot, None
    positions = [f"c{[c.name for c in columns].index(k)}" for k in keys]
    last = [str(texts[p][read - 1].as_py()) for p in positions]
    return snapshot_rows(cursor.table, columns, texts, lsn), snapshot, Cursor(cursor.table, last)


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


def next_chunk(
    pg_conn: Any, storage: JobStorage, uid: str, position: dict[str, Any], cursor: Cursor, rows: int
) -> dict[str, Any]:
    """``position`` (a barrier's, its columns recorded) with the chunk at ``cursor`` read (its file written
    under :func:`chunk_dir`, replacing those of checkpoints that did not complete) and the cursor after it."""
    tables = position["tables"]
    columns = cdc_schema.from_json(uid, cursor.table, position["columns"][cursor.table])
    data, snapshot, after = read_chunk(pg_conn, uid, cursor, columns, rows, lsn_to_int(position["lsn"]))
    storage.delete(chunk_dir(uid))
    file = f"{chunk_dir(uid)}/{uuid.uuid4().hex}.parquet"
    storage.write_atomic(file, parquet(data))
    if after is None:
        i = tables.index(cursor.table) + 1
        after = Cursor(tables[i], None) if i < len(tables) else None
    log.info(
        "source %s: snapshot chunk of %s after %s: %d row(s); next: %s",
        uid,
        cursor.table,
        cursor.after,
        data.num_rows,
        "done" if after is None else f"{after.table} after {after.after}",
    )
    chunk = Chunk(file, snapshot, data.num_rows).to_json()
    return {**position, "chunk": chunk, **({} if after is None else {"snapshot_cursor": after.to_json()})}
