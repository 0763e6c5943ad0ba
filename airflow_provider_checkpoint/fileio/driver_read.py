"""Small Parquet inputs read on the driver with pyarrow, only where that gives exactly Spark's rows.

A step whose input files are small (their sizes known from the barrier) can hand them to a consumer
that takes rows the driver holds (an upsert sink's driver merge) without a Spark job. The rows must be
those Spark's Parquet reader gives with the declared schema, as ``DataFrame.toArrow`` would return
them; :func:`read_exactly` returns ``None`` (read them with Spark) wherever pyarrow's answer could
differ:

- a declared column that is not of a flat type (nested types are read by Spark);
- a file column the Python engine's reader refuses (:mod:`.parquet_types`: a type Spark's reader
  refuses or reads other values of, a declared name two file columns match ignoring case);
- a date before 1582-10-15 or a timestamp before 1900 in a file Spark did not mark as written
  proleptic (Spark may rebase them from the hybrid calendar or refuse them);
- a file pyarrow cannot read (Spark then reads it and fails as it does).

The file's columns are matched and converted as the Python engine reads them
(:class:`~.file_readers.ParquetReader`): names ignoring case, types widened as Spark's reader widens them.
A declared column a file lacks is null, as Spark reads it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.fileio.parquet_types import ParquetTypeError

if TYPE_CHECKING:
    import fsspec
    import pyarrow as pa
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

DRIVER_READ_BYTES = 16 << 20
"""Parquet inputs of at most this many bytes in all are read on the driver when a consumer takes them there."""


def _flat(t: pa.DataType) -> bool:
    import pyarrow.types as pt

    checks = (pt.is_boolean, pt.is_integer, pt.is_floating, pt.is_string, pt.is_large_string, pt.is_binary)
    more = (pt.is_large_binary, pt.is_date32, pt.is_timestamp, pt.is_decimal128)
    return any(check(t) for check in (*checks, *more)) and not pt.is_float16(t)


def expected_schema(declared: StructType, large_types: bool = False) -> pa.Schema:
    """The Arrow schema ``DataFrame.toArrow`` gives for a file source read with ``declared`` (every column
    nullable); ``large_types``: the session's ``spark.sql.execution.arrow.useLargeVarTypes``."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from airflow_provider_checkpoint.fileio.scans import as_nullable

    return to_arrow_schema(as_nullable(declared), timezone="UTC", prefers_large_types=large_types)


def _read_file(fs: fsspec.AbstractFileSystem, path: str, size: int, expected: pa.Schema) -> pa.Table:
    import pyarrow as pa

    from airflow_provider_checkpoint.fileio.file_readers import ParquetReader

    # dates and timestamps Spark may rebase refused, whatever the session's mode (EXCEPTION: Spark's own
    # reader then fails or rebases as the file says)
    read = ParquetReader(fs, expected, sizes={path: size}, rebase=("EXCEPTION", "EXCEPTION"))
    return pa.Table.from_batches(list(read(path)), schema=expected)


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
            tables.append(_read_file(fs, path, size, expected))
        except (OSError, pa.ArrowException, ParquetTypeError) as e:  # Spark reads it (and fails as it does)
            log.info("read of %s on the driver declined, Spark reads the input: %s", path, e)
            return None
    return pa.concat_tables(tables) if tables else expected.empty_table()
