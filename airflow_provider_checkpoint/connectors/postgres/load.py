"""The step side of :class:`~.sink.PostgresTableSink`'s load into a staging table.

:func:`copy_partitions` loads each partition in one transaction, one ``COPY`` per Arrow batch
(binary where the column types allow, else CSV, else value by value), and returns one small row
(counts, error) per partition. It runs in the executors (``mapInArrow``), or in the driver on rows
the driver holds already (:func:`from_driver`: a few slices in parallel, each a partition).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.connectors.postgres.sql import DEAD_LETTER_STAGED, ident, idents

if TYPE_CHECKING:
    import psycopg
    import pyarrow as pa
    from psycopg import sql
    from pyspark.sql import DataFrame

    from airflow_provider_checkpoint.connectors.postgres.connection import PgConnection


def _nul_column(row: dict[str, Any]) -> str | None:
    """The first column of ``row`` whose value holds a NUL byte (PostgreSQL text cannot), if any."""
    return next((c for c, v in row.items() if _has_nul(v)), None)


def _has_nul(value: Any) -> bool:
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return isinstance(value, str) and "\0" in value


NUL_REFUSED = "a NUL byte (0x00) in text, which PostgreSQL cannot store"


@dataclass(frozen=True)
class Refusal:
    """A row PostgreSQL refused: its index in the rows sent (``None``: not told), column, message."""

    index: int | None
    column: str | None
    message: str

    @classmethod
    def of_server(cls, error: psycopg.Error, count: int) -> Refusal:
        """From a failed value-by-value ``COPY`` of ``count`` rows: the line and column in the
        server's context (``None`` where it does not say, as from a server in another language)."""
        found = re.search(r"line (\d+)(?:, column (\w+))?", error.diag.context or "")
        index = int(found.group(1)) - 1 if found else None
        return cls(
            index if index is not None and 0 <= index < count else None,
            found.group(2) if found else None,
            (error.diag.message_primary or str(error)).strip(),
        )

    def describe(self, row: dict[str, Any], keys: list[str], partition: int) -> str:
        """The refused column and the key (or row number) of ``row``, and the message."""
        where = f"partition {partition}" if self.index is None else f"row {self.index + 1} of partition {partition}"
        if keys and row:
            where = "key (" + ", ".join(f"{k}={row.get(k)!r}" for k in keys) + ")"
        return f"column {self.column or '?'}, {where}: {self.message}"

    def dead_letter(self, row: dict[str, Any], keys: list[str]) -> tuple[str | None, ...]:
        """:data:`DEAD_LETTER_STAGED` of ``row``: key and row as JSON text (a NUL byte escaped as ``\\u0000``)."""
        key = json.dumps({k: row[k] for k in keys}, default=_json_value, ensure_ascii=False) if keys else None
        return self.column, key, json.dumps(row, default=_json_value, ensure_ascii=False), self.message


def _json_value(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return "\\x" + bytes(value).hex()
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def _as_csv(batches: list[pa.RecordBatch]) -> Iterator[bytes] | None:
    """``batches`` as headerless CSV (Arrow's writer, no Python per row), a batch at a time; ``None`` if a column
    has no CSV form."""
    import pyarrow as pa

    if any(pa.types.is_nested(f.type) or pa.types.is_binary(f.type) for f in batches[0].schema):
        return None
    return map(_csv_of, batches)


def _csv_of(batch: pa.RecordBatch) -> bytes:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    out = pa.BufferOutputStream()
    pacsv.write_csv(batch, out, write_options=pacsv.WriteOptions(include_header=False))
    return bytes(out.getvalue())


BINARY_TYPES: dict[str, str] = {
    "int8": "smallint",
    "int16": "smallint",
    "int32": "integer",
    "int64": "bigint",
    "float": "real",
    "double": "double precision",
    "bool": "boolean",
    "string": "text",
    "large_string": "text",
    "binary": "bytea",
    "large_binary": "bytea",
    "date32[day]": "date",
}
"""Arrow type → the PostgreSQL type whose binary ``COPY`` form :mod:`pgpq` writes for it exactly."""


def as_binary(batches: list[pa.RecordBatch], types: Mapping[str, str]) -> Iterator[bytes] | None:
    """``batches`` (one schema) in PostgreSQL's binary ``COPY`` form, one stream written by :mod:`pgpq` (no Python
    per row), when every column's staging type (``types``) is the one its Arrow type encodes to
    (:data:`BINARY_TYPES`), else ``None``: a binary ``COPY`` must match the column types exactly, where text is
    converted."""
    import pgpq

    schema = batches[0].schema
    if any(BINARY_TYPES.get(str(f.type)) != types.get(f.name) for f in schema):
        return None
    encoder = pgpq.ArrowToPostgresBinaryEncoder(schema)  # one COPY: header, rows, trailer
    return itertools.chain(
        [encoder.write_header()], map(encoder.write_batch, batches), (encoder.finish() for _ in range(1))
    )


def _write_rows(cur: psycopg.Cursor[Any], statement: sql.Composed, rows: list[Any]) -> None:
    """``COPY`` of ``rows`` (dicts or tuples) value by value: psycopg adapts arrays and bytes."""
    with cur.copy(statement) as copy:
        for row in rows:
            copy.write_row(tuple(row.values()) if isinstance(row, dict) else row)


CHUNK_BYTES = 64 << 20
"""Arrow bytes of consecutive batches sent in one ``COPY`` (one savepoint) at most: the server parses a batch while
the next is encoded, with no round trip between them; a refused chunk is sent again a batch at a time."""


def _chunks(batches: Iterator[pa.RecordBatch], columns: list[str]) -> Iterator[list[pa.RecordBatch]]:
    """``batches`` (their ``columns``) in runs of up to :data:`CHUNK_BYTES` (a larger batch alone)."""
    chunk: list[pa.RecordBatch] = []
    size = 0
    for batch in batches:
        batch = batch.select(columns)
        if chunk and size + batch.nbytes > CHUNK_BYTES:
            yield chunk
            chunk, size = [], 0
        chunk.append(batch)
        size += batch.nbytes
    if chunk:
        yield chunk


def _copy(
    cur: psycopg.Cursor[Any], batches: list[pa.RecordBatch], types: Mapping[str, str], target: sql.Composed
) -> None:
    """One ``COPY`` (``target``, a ``COPY … FROM STDIN``) of ``batches``: binary (:func:`as_binary`), else CSV
    (:func:`_as_csv`), else value by value."""
    from psycopg import sql

    if (binary := as_binary(batches, types)) is not None:
        with cur.copy(target + sql.SQL(" (FORMAT binary)")) as copy:
            for part in binary:
                copy.write(part)
    elif (text := _as_csv(batches)) is not None:
        with cur.copy(target + sql.SQL(" (FORMAT csv)")) as copy:
            for part in text:
                copy.write(part)
    else:
        _write_rows(cur, target, [row for batch in batches for row in batch.to_pylist()])


ROW_BY_ROW_CHUNK = 1000
"""Rows per ``COPY`` when a refused batch is sent again value by value: each refused row costs
at most two ``COPY`` of this many rows."""


def _load_skipping_refused(
    cur: psycopg.Cursor[Any], statement: sql.Composed, rows: list[dict[str, Any]]
) -> Iterator[Refusal]:
    """Load ``rows`` value by value, each chunk under a savepoint, skipping every row PostgreSQL
    refuses, and yield a :class:`Refusal` for each: first the rows holding a NUL byte (psycopg
    refuses them before the server sees the rows sent ahead of them, so they are found before
    sending), then the rows the server refuses, by the line it names. Where the server does not
    name one, the refusal has no index and nothing more is loaded."""
    import psycopg

    nul = {i: column for i, row in enumerate(rows) if (column := _nul_column(row))}
    for index, column in nul.items():
        yield Refusal(index, column, NUL_REFUSED)
    rest = [i for i in range(len(rows)) if i not in nul]
    start = 0
    while start < len(rest):
        chunk = rest[start : start + ROW_BY_ROW_CHUNK]
        refused: Refusal | None = None
        try:
            with cur.connection.transaction():
                _write_rows(cur, statement, [rows[i] for i in chunk])
        except psycopg.DataError as e:
            refused = Refusal.of_server(e, len(chunk))
        if refused is None:
            start += len(chunk)
            continue
        if refused.index is None:
            yield refused
            return
        if refused.index:
            with cur.connection.transaction():
                _write_rows(cur, statement, [rows[i] for i in chunk[: refused.index]])
        yield Refusal(chunk[refused.index], refused.column, refused.message)
        start += refused.index + 1


def one_stream_per_core(df: DataFrame) -> DataFrame:
    """``df`` in at most as many partitions as the session has cores (merged without a shuffle):
    one ``COPY`` stream per core. Each Python task costs a fixed start (worker, connection,
    transaction) that, with more partitions than cores, is paid several times per core. Under
    Spark Connect, where the client does not see the cores, ``df`` as it is."""
    context = getattr(df.sparkSession, "sparkContext", None)
    return df if context is None else df.coalesce(max(int(context.defaultParallelism), 1))


DRIVER_STREAMS = 2
"""Parallel ``COPY`` streams from the driver (threads, a connection and transaction each), as the executors
send one per core: on two cores the server parses two streams in ≈ 0.7 of one's time (docs/benchmarks.md)."""
STREAM_ROWS = 100_000
"""Rows per extra stream from the driver at least: fewer go in fewer streams (each costs a connection)."""
BATCH_ROWS = 65_536
"""Rows per ``COPY`` from the driver: the next batch is encoded while the server parses the last one."""


def from_driver(
    load: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]], rows: pa.Table
) -> list[dict[str, Any]]:
    """``load`` (:func:`copy_partitions`' function) over ``rows`` held on the driver, in up to
    :data:`DRIVER_STREAMS` parallel slices, each one partition (one transaction): its :data:`LOAD_RESULT` rows."""
    from concurrent.futures import ThreadPoolExecutor

    streams = max(1, min(DRIVER_STREAMS, rows.num_rows // STREAM_ROWS))
    size = -(-rows.num_rows // streams)
    parts = [rows.slice(i * size, size) for i in range(streams)]

    def one(part: pa.Table) -> list[dict[str, Any]]:
        return [r for batch in load(iter(part.to_batches(max_chunksize=BATCH_ROWS))) for r in batch.to_pylist()]

    if streams == 1:
        return one(parts[0])
    with ThreadPoolExecutor(streams) as pool:
        return [r for results in pool.map(one, parts) for r in results]


LOAD_RESULT = "rows long, refused long, error string"
"""What :func:`copy_partitions` yields per partition."""


def copy_partitions(
    conn: PgConnection,
    schema: str,
    staging: str,
    types: Mapping[str, str],
    keys: list[str],
    dead_letters: str | None,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function loading each partition into ``staging`` (whose columns and their
    types are ``types``) in one transaction; it yields :data:`LOAD_RESULT`: the rows loaded, the rows
    refused, and the first refusal (column, key, message) that fails the partition (its transaction
    rolled back).

    Consecutive batches of up to :data:`CHUNK_BYTES` go in one ``COPY`` under a savepoint (:func:`_copy`):
    PostgreSQL's binary form written by :mod:`pgpq` where every column's type allows (:func:`as_binary`), else
    CSV written by Arrow where its columns allow, else value by value. A refused chunk is sent again a batch
    at a time, and a refused batch value by value to find the refused rows:
    without ``dead_letters`` the first one fails the partition; with it (a staging table of
    :data:`DEAD_LETTER_STAGED` columns) each refused row is skipped and staged there as a dead
    letter (:meth:`Refusal.dead_letter`), in the same transaction.
    """

    def load(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import psycopg
        import pyarrow as pa
        from psycopg import sql
        from pyspark import TaskContext

        task = TaskContext.get()
        partition = task.partitionId() if task else 0
        columns = list(types)
        target = sql.SQL("COPY {} ({}) FROM STDIN").format(ident(schema, staging), idents(columns))
        loaded, letters, error = 0, [], ""
        with conn.connect(autocommit=True) as db, db.cursor() as cur, db.transaction():
            for chunk in _chunks(batches, columns):
                pieces = [chunk]
                while pieces and not error:
                    piece = pieces.pop(0)
                    try:
                        with db.transaction():
                            _copy(cur, piece, types, target)
                        loaded += sum(b.num_rows for b in piece)
                        continue
                    except psycopg.DataError:
                        if len(piece) > 1:  # each batch again, alone: the refused rows are in one of them
                            pieces[:0] = [[b] for b in piece]
                            continue
                        rows = piece[0].to_pylist()
                    loaded += len(rows)
                    for refused in _load_skipping_refused(cur, target, rows):
                        row = rows[refused.index] if refused.index is not None else {}
                        if dead_letters is None or refused.index is None:
                            error = refused.describe(row, keys, partition)
                            break
                        letters.append(refused.dead_letter(row, keys))
                if error:
                    break
            if error:
                raise psycopg.Rollback()
            if letters:
                staged = sql.SQL("COPY {} ({}) FROM STDIN").format(
                    ident(schema, str(dead_letters)), idents(list(DEAD_LETTER_STAGED))
                )
                _write_rows(cur, staged, letters)
        yield pa.RecordBatch.from_pydict({"rows": [loaded - len(letters)], "refused": [len(letters)], "error": [error]})

    return load
