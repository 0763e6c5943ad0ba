"""The rows of :class:`~.cdc.PostgresCdcSource`: decoded changes and snapshot rows as one Arrow table of the
tables' columns (typed by :mod:`.cdc_types`) and :data:`METADATA`."""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.connectors.postgres.cdc_types import (
    TableColumn,
    converter,
    identity_problem,
    table_columns,
)
from airflow_provider_checkpoint.connectors.postgres.pgoutput import (
    Transaction,
    int_to_lsn,
)
from airflow_provider_checkpoint.exceptions import CdcSourceError
from airflow_provider_checkpoint.fileio.arrow_numpy import arrow_of, strings_of

if TYPE_CHECKING:
    import pyarrow as pa

METADATA = ("source_table", "op", "deleted", "lsn", "commit_time", "xid")
METADATA_DDL = "source_table STRING, op STRING, deleted BOOLEAN, lsn BIGINT, commit_time TIMESTAMP, xid BIGINT"
DELETED = "deleted"


def merged_columns(uid: str, tables: dict[str, list[TableColumn]]) -> list[TableColumn]:
    """Every column of every table, merged by name (one name, one type across tables); a column named as
    one of :data:`METADATA` or typed differently in two tables is refused."""
    merged: dict[str, TableColumn] = {}
    for columns in tables.values():
        for column in columns:
            seen = merged.setdefault(column.name, column)
            if column.name in METADATA:
                raise CdcSourceError(f"source {uid}: {column.where()} clashes with column {column.name}")
            if seen.spark_type() != column.spark_type():
                raise CdcSourceError(
                    f"source {uid}: {column.where()} is {column.spark_type()} but {seen.where()} is "
                    f"{seen.spark_type()}: split the tables over two sources"
                )
    return list(merged.values())


def check_tables(uid: str, conn: Any, tables: list[str]) -> None:
    """Refuse, before any publication or slot exists, a table without a row identity or with a column the
    source cannot convert (or merge with the other tables')."""
    problems = [p for p in (identity_problem(conn, t) for t in tables) if p]
    if problems:
        raise CdcSourceError(f"source {uid}: " + "; ".join(problems))
    merged_columns(uid, {t: table_columns(conn, t) for t in tables})


def truncate_refusal(uid: str, txn: Transaction) -> CdcSourceError:
    names = ", ".join(r.qualified for r in txn.truncated)
    return CdcSourceError(
        f"source {uid}: TRUNCATE of {names} (transaction {txn.xid}, commit LSN {int_to_lsn(txn.commit_lsn)}) "
        "cannot be applied as row changes (which keys it removed is in no WAL record); capture the tables "
        "anew (a new job: a new slot and snapshot, into emptied targets), or leave truncate out of the "
        "publication (publish = 'insert, update, delete') if the table is never truncated for real"
    )


def toast_refusal(uid: str, table: str, column: str) -> CdcSourceError:
    return CdcSourceError(
        f"source {uid}: an update of table {table} left TOASTed column {column} "
        f"unchanged and PostgreSQL did not send its value; run ALTER TABLE {table} REPLICA "
        "IDENTITY FULL, then restore the job from a checkpoint before this change"
    )


def arrow(columns: list[TableColumn], rows: Iterable[tuple[Any, tuple[Any, ...]]]) -> pa.Table:
    """The rows (values by name, or in ``columns`` order) as an Arrow table of the columns then
    :data:`METADATA`."""
    import pyarrow as pa

    names = [c.name for c in columns]
    texts: list[list[Any]] = [[] for _ in columns]
    metas: list[list[Any]] = [[] for _ in METADATA]
    for values, meta in rows:
        if isinstance(values, dict):
            get = values.get
            for out, name in zip(texts, names, strict=True):
                out.append(get(name))
        else:
            for out, value in zip(texts, values, strict=True):
                out.append(value)
        for out, value in zip(metas, meta, strict=True):
            out.append(value)
    fields = _fields(columns)
    arrays = [typed(c, t) for c, t in zip(columns, texts, strict=True)]
    arrays += [pa.array(m, f.type) for m, f in zip(metas, fields[len(columns) :], strict=True)]
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _fields(columns: list[TableColumn]) -> list[pa.Field]:
    import pyarrow as pa

    return [pa.field(c.name, c.arrow_type()) for c in columns] + [
        pa.field("source_table", pa.string()),
        pa.field("op", pa.string()),
        pa.field(DELETED, pa.bool_()),
        pa.field("lsn", pa.int64()),
        pa.field("commit_time", pa.timestamp("us", tz="UTC")),
        pa.field("xid", pa.int64()),
    ]


def arrow_columns(
    columns: list[TableColumn],
    texts: list[pa.Array],
    tables: pa.Array,
    ops: pa.Array,
    txns: list[tuple[int, int, int, int]],
) -> pa.Table:
    """The rows as :func:`arrow` gives them, from each column's texts (strings), each row's table and op, and
    per transaction (in row order) its commit LSN, commit time, id and number of rows."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    fields = _fields(columns)
    counts = np.array([t[3] for t in txns], dtype=np.int64)
    arrays = [typed(c, t) for c, t in zip(columns, texts, strict=True)]
    arrays += [tables, ops, pc.equal(ops, strings_of(["delete"])[0])]
    for i, field in ((0, fields[-3]), (1, fields[-2]), (2, fields[-1])):
        values = np.repeat(np.array([t[i] for t in txns], dtype=np.int64), counts)
        arrays.append(arrow_of(values).cast(field.type))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def typed(column: TableColumn, texts: list[str | None] | pa.Array) -> pa.Array:
    """One column's values from their texts: strings as they are, integers and floats parsed by Arrow, the
    rest (and any value Arrow does not parse, so that the error names it) by :func:`.cdc_types.converter`."""
    import pyarrow as pa

    kind = column.arrow_type()
    strings = texts if isinstance(texts, pa.Array) else pa.array(texts, pa.string())
    if pa.types.is_string(kind):
        return strings
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        try:
            return strings.cast(kind)
        except pa.ArrowInvalid:
            pass
    convert = converter(column)
    return pa.array([convert(t) for t in strings.to_pylist()], kind)


def _aligned(part: pa.Table, schema: pa.Schema) -> pa.Table:
    """A snapshot table's file with every column of ``schema`` (those of other tables null)."""
    import pyarrow as pa

    arrays = [part[f.name] if f.name in part.column_names else pa.nulls(part.num_rows, f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def from_parquet(columns: list[TableColumn], files: Iterable[bytes]) -> pa.Table:
    """The snapshot's Parquet files (one per table) as one table of every column of ``columns``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    empty = arrow(columns, ())
    return pa.concat_tables([empty, *(_aligned(pq.read_table(io.BytesIO(f)), empty.schema) for f in files)])


def parquet(table: pa.Table) -> bytes:
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()
