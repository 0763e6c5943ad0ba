"""The initial snapshot's read of one table: ``COPY (SELECT …) TO STDOUT`` in CSV, parsed by Arrow, under the
transaction's snapshot (the slot's exported one), into the rows of :func:`.cdc_rows.arrow`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.connectors.postgres.cdc_rows import arrow, typed
from airflow_provider_checkpoint.connectors.postgres.cdc_types import TableColumn, quote, quoted_table

if TYPE_CHECKING:
    import pyarrow as pa


def copy_rows(conn: Any, table: str, columns: list[TableColumn], lsn: int) -> pa.Table:
    """Every row of ``table`` as ``conn``'s transaction sees it, as snapshot rows (``op`` insert, ``lsn``)
    typed like the stream's: each value is read as text (``::text``) and goes through :func:`.cdc_rows.typed`.

    CSV keeps NULL (an unquoted empty field) apart from the empty string (a quoted one)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    names = ", ".join(f"{quote(c.name)}::text" for c in columns)
    data = bytearray()
    with (
        conn.cursor() as cursor,
        cursor.copy(f"COPY (SELECT {names} FROM {quoted_table(table)}) TO STDOUT (FORMAT csv)") as copy,
    ):
        for chunk in copy:
            data += chunk
    positions = [f"c{i}" for i in range(len(columns))]
    parsed = (
        pacsv.read_csv(
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
        if data
        else None
    )
    empty = arrow(columns, ())
    if parsed is None:
        return empty
    n = parsed.num_rows
    values = [typed(c, parsed[p].combine_chunks()) for c, p in zip(columns, positions, strict=True)]
    meta = [
        pa.array([table] * n, pa.string()),
        pa.array(["insert"] * n, pa.string()),
        pa.array([False] * n, pa.bool_()),
        pa.array([lsn] * n, pa.int64()),
        pa.nulls(n, pa.timestamp("us", tz="UTC")),
        pa.nulls(n, pa.int64()),
    ]
    return pa.Table.from_arrays([*values, *meta], schema=empty.schema)
