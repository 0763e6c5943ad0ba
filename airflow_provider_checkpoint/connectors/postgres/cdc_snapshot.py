"""The initial snapshot's reads: ``COPY (SELECT …) TO STDOUT`` in CSV, parsed by Arrow, under the transaction's
snapshot (the slot's exported one, or a chunk's own), into the rows of :func:`.cdc_rows.arrow`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.connectors.postgres.cdc_rows import arrow, typed
from airflow_provider_checkpoint.connectors.postgres.cdc_types import TableColumn, quote, quoted_table
from airflow_provider_checkpoint.core.faults import fault_point
from airflow_provider_checkpoint.exceptions import SinkUnavailableError

if TYPE_CHECKING:
    import pyarrow as pa


def copy_rows(conn: Any, uid: str, table: str, columns: list[TableColumn], lsn: int) -> pa.Table:
    """Every row of ``table`` as ``conn``'s transaction (the slot's exported snapshot) sees it, as snapshot rows
    (``op`` insert, ``lsn``) typed like the stream's: each value is read as text (``::text``) and goes through
    :func:`.cdc_rows.typed`."""
    texts = copy_texts(conn, select_texts(table, columns), len(columns), uid, table)
    return snapshot_rows(table, columns, texts, lsn)


@contextmanager
def server_lost(uid: str, slot: str, tables: list[str]) -> Iterator[None]:
    """The initial snapshot of ``tables`` taken inside: the server lost meanwhile (a crash, a restart) raises
    :class:`SinkUnavailableError` (retried); the next barrier drops ``slot`` and takes the snapshot again."""
    import psycopg

    try:
        yield
    except psycopg.OperationalError as e:
        lines = str(e).strip().splitlines()
        raise SinkUnavailableError(
            f"source {uid}: PostgreSQL went away while taking the initial snapshot of {', '.join(tables)} "
            f"({lines[0] if lines else type(e).__name__}); nothing was recorded: the next checkpoint drops slot "
            f"{slot}, which this barrier created, and takes the snapshot again"
        ) from e


def select_texts(table: str, columns: list[TableColumn]) -> str:
    """``SELECT`` of every column of ``table`` as text (a query to end with a ``WHERE``/``ORDER BY``)."""
    return f"SELECT {', '.join(f'{quote(c.name)}::text' for c in columns)} FROM {quoted_table(table)}"


def copy_texts(conn: Any, query: str, width: int, uid: str, table: str) -> pa.Table | None:
    """``COPY (query) TO STDOUT`` in CSV, parsed by Arrow into ``width`` string columns ``c0…``; ``None`` when
    the query returns no row. CSV keeps NULL (an unquoted empty field) apart from the empty string (a quoted
    one). Source ``uid``'s ``table``: for the fault point ``trigger.snapshot_copy`` (its first row read)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    data = bytearray()
    with conn.cursor() as cursor, cursor.copy(f"COPY ({query}) TO STDOUT (FORMAT csv)") as copy:
        for chunk in copy:
            if not data:
                fault_point("trigger.snapshot_copy", source=uid, table=table)
            data += chunk
    if not data:
        return None
    positions = [f"c{i}" for i in range(width)]
    return pacsv.read_csv(
        pa.py_buffer(bytes(data)),
        read_options=pacsv.ReadOptions(column_names=positions),
        parse_options=pacsv.ParseOptions(newlines_in_values=True),
        convert_options=pacsv.ConvertOptions(
            column_types=dict.fromkeys(positions, pa.string()),
            null_values=[""],
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,
        ),
    )


def snapshot_rows(table: str, columns: list[TableColumn], parsed: pa.Table | None, lsn: int) -> pa.Table:
    """The texts :func:`copy_texts` read as snapshot rows of ``table``: ``op`` insert, ``lsn``."""
    import pyarrow as pa

    empty = arrow(columns, ())
    if parsed is None:
        return empty
    n = parsed.num_rows
    values = [typed(c, parsed[f"c{i}"].combine_chunks()) for i, c in enumerate(columns)]
    meta = [
        pa.array([table] * n, pa.string()),
        pa.array(["insert"] * n, pa.string()),
        pa.array([False] * n, pa.bool_()),
        pa.array([lsn] * n, pa.int64()),
        pa.nulls(n, pa.timestamp("us", tz="UTC")),
        pa.nulls(n, pa.int64()),
    ]
    return pa.Table.from_arrays([*values, *meta], schema=empty.schema)
