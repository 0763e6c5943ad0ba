"""Small Parquet inputs read on the driver with pyarrow, only where that gives exactly Spark's rows.

A step whose input files are small (their sizes known from the barrier) can hand them to a consumer
that takes rows the driver holds (an upsert sink's driver merge) without a Spark job. The rows must be
those Spark's Parquet reader gives with the declared schema, as ``DataFrame.toArrow`` would return
them; :func:`read_exactly` returns ``None`` (read them with Spark) wherever pyarrow's answer could
differ:

- a declared column that is not of a flat type (nested types are read by Spark);
- a file column whose Arrow type is not the declared one's (Spark may widen or refuse: an ``int32``
  declared ``bigint``, INT96 or millisecond timestamps, unsigned integers, binary declared string);
- a declared name the file has only in another case, or more than once ignoring case (Spark matches
  names case-insensitively by default);
- a date before 1582-10-15 or a timestamp before 1900 (Spark may rebase them from the hybrid
  calendar or refuse them, by the file's writer and the session's rebase mode);
- a file pyarrow cannot read (Spark then reads it and fails as it does).

A declared column a file lacks is null, as Spark reads it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.storage.object_store import open_sized

if TYPE_CHECKING:
    import fsspec
    import pyarrow as pa
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

DRIVER_READ_BYTES = 16 << 20
"""Parquet inputs of at most this many bytes in all are read on the driver when a consumer takes them there."""
_OLDEST_DATE_DAYS = -141427  # 1582-10-15: the Gregorian calendar's first day
_OLDEST_TIMESTAMP_US = -2208988800 * 1_000_000  # 1900-01-01T00:00:00Z: before it, time zones' rebase differs


def _flat(t: pa.DataType) -> bool:
    import pyarrow.types as pt

    checks = (pt.is_boolean, pt.is_integer, pt.is_floating, pt.is_string, pt.is_large_string, pt.is_binary)
    more = (pt.is_large_binary, pt.is_date32, pt.is_timestamp, pt.is_decimal128)
    return any(check(t) for check in (*checks, *more)) and not pt.is_float16(t)


def _same_type(found: pa.DataType, expected: pa.DataType) -> bool:
    """Whether a file's Arrow type holds exactly the values Spark gives for ``expected``: equal types, a
    string or binary's large variant, or a UTC-adjusted microsecond timestamp of any zone."""
    import pyarrow as pa
    import pyarrow.types as pt

    if found.equals(expected):
        return True
    if pt.is_timestamp(found) and pt.is_timestamp(expected):
        return found.unit == expected.unit == "us" and found.tz is not None and expected.tz is not None
    pairs = [(pa.string(), pa.large_string()), (pa.binary(), pa.large_binary())]
    return any({found, expected} == set(pair) for pair in pairs)


def _ancient(column: pa.ChunkedArray) -> bool:
    """Whether a date or timestamp column holds a value Spark may rebase or refuse (see module doc)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.types as pt

    if pt.is_date32(column.type):
        oldest = pc.min(column.cast(pa.int32())).as_py()
        return oldest is not None and oldest < _OLDEST_DATE_DAYS
    if pt.is_timestamp(column.type):
        oldest = pc.min(column.cast(pa.int64())).as_py()
        return oldest is not None and oldest < _OLDEST_TIMESTAMP_US
    return False


def expected_schema(declared: StructType, large_types: bool = False) -> pa.Schema:
    """The Arrow schema ``DataFrame.toArrow`` gives for a file source read with ``declared`` (every column
    nullable); ``large_types``: the session's ``spark.sql.execution.arrow.useLargeVarTypes``."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from airflow_provider_checkpoint.fileio.scans import as_nullable

    return to_arrow_schema(as_nullable(declared), timezone="UTC", prefers_large_types=large_types)


def _columns(file_schema: pa.Schema, expected: pa.Schema) -> list[str] | None:
    """The declared columns the file has (the others read as null), or ``None`` if Spark's answer may differ."""
    names = file_schema.names
    present = []
    for field in expected:
        folded = [n for n in names if n.lower() == field.name.lower()]
        if not folded:
            continue
        if folded != [field.name] or not _same_type(file_schema.field(field.name).type, field.type):
            return None
        present.append(field.name)
    return present


def _read_file(fs: fsspec.AbstractFileSystem, path: str, size: int, expected: pa.Schema) -> pa.Table | None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open_sized(fs, path, size) as f:
        file = pq.ParquetFile(f, page_checksum_verification=True)  # as the session's Parquet reader
        present = _columns(file.schema_arrow, expected)
        if present is None:
            return None
        read = file.read(columns=present, use_threads=False)
    columns = [read[f.name].cast(f.type) if f.name in present else pa.nulls(read.num_rows, f.type) for f in expected]
    table = pa.Table.from_arrays(columns, schema=expected)
    return None if any(_ancient(table[f.name]) for f in expected if f.name in present) else table


def read_exactly(
    fs: fsspec.AbstractFileSystem, paths: Sequence[str], sizes: Sequence[int], expected: pa.Schema
) -> pa.Table | None:
    """The rows of the Parquet files ``paths`` (in this order, each file's rows in order) as Spark reads
    them into ``expected`` (:func:`expected_schema`); ``None`` where pyarrow's answer could differ from
    Spark's (module doc): read them with Spark then. ``sizes``: each file's size at the barrier (checked
    unchanged by the caller)."""
    import pyarrow as pa

    if not all(_flat(f.type) for f in expected):
        return None
    tables = []
    for path, size in zip(paths, sizes, strict=True):
        try:
            table = _read_file(fs, path, size, expected)
        except (OSError, pa.ArrowException) as e:  # Spark reads it again and fails as it does
            log.info("read of %s on the driver failed, Spark reads the input: %s", path, e)
            return None
        if table is None:
            return None
        tables.append(table)
    return pa.concat_tables(tables) if tables else expected.empty_table()
