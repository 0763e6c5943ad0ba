"""Spark reading files through :mod:`.writes`'s engines: Parquet, and JSON Lines or CSV parsed permissively.

With the ``python`` engine a read is one Spark task per file (up to
:data:`MAX_READ_TASKS`): the executor opens it through fsspec and hands Spark Arrow batches
of the requested schema (:mod:`.file_readers`). Files of at most
:data:`DRIVER_READ_BYTES` in all (their sizes known beforehand) are read the same way on the
driver, whose filesystem client is warm, and handed to Spark as Arrow: no task, and no Python
worker to start for it.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow_provider_checkpoint.fileio.file_readers import CORRUPT, ParquetReader, RecordReader
from airflow_provider_checkpoint.fileio.frames import arrow_frame
from airflow_provider_checkpoint.fileio.parquet_types import INT96_REBASE_CONF, REBASE_CONF
from airflow_provider_checkpoint.fileio.records import check_options
from airflow_provider_checkpoint.fileio.writes import engine_for, url
from airflow_provider_checkpoint.storage.object_store import for_executors

if TYPE_CHECKING:
    import fsspec
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

MAX_READ_TASKS = 256
"""A Python read spreads its files over at most this many tasks."""
DRIVER_READ_BYTES = 8 << 20
"""A Python read of files of at most this many bytes in all, their sizes known, runs on the driver."""


def read_parquet(
    spark: SparkSession,
    fs: fsspec.AbstractFileSystem,
    paths: Sequence[str],
    schema: StructType | None = None,
    file_column: FileColumn | None = None,
    engine: str | None = None,
    options: dict[str, str] | None = None,
    row_index: str | None = None,
    sizes: Sequence[int] | None = None,
    loaded: Mapping[str, bytes] | None = None,
    damaged: str = CORRUPT,
) -> DataFrame:
    """The rows of the Parquet files ``paths`` on ``fs`` with ``schema`` (a column a file lacks is null;
    ``None``: the first file's columns).

    A file that fails to decode (a page checksum, its footer) fails the read with an ``OSError``
    ``"<damaged> <file URL>: <why>"`` (``damaged``: what the file is, e.g. with a refusal's mark).

    ``file_column``: also a column naming each row's file (:class:`FileColumn`). ``options``:
    Spark's Parquet reader options (the Python engine takes none). ``row_index``: also a column
    of that name holding each row's position in its file (from 0, as ``_metadata.row_index``).
    ``sizes`` (bytes, one per path, known from a handle): the Python engine then reads a small file
    on an object store in one request (:func:`~.object_store.open_sized`). ``loaded`` (path → bytes the
    driver already read): the Python engine's tasks get these files' bytes with the plan and read them
    from memory, not from ``fs`` (keep them small: they travel with the plan to every task of the scan).
    """
    if not paths:
        if schema is None:
            raise ValueError("reading no files needs their schema")
        return spark.createDataFrame([], _with_file(_with_row_index(schema, row_index), file_column))
    if engine_for(spark, fs, engine) == "hadoop":
        from pyspark.sql import functions as F

        reader = spark.read.options(**(options or {}))
        reader = reader.schema(schema) if schema is not None else reader
        df = reader.parquet(*[url(fs, p) for p in paths])
        df = df.withColumn(row_index, F.col("_metadata.row_index")) if row_index else df
        return _with_path_column(df, file_column)
    check_options("parquet", options or {})
    schema = as_nullable(schema if schema is not None else footer_schema(fs, paths[0]))
    known = dict(zip(paths, sizes, strict=True)) if sizes is not None else {}
    driver = on_driver(sizes)
    rebase = (spark.conf.get(REBASE_CONF, "CORRECTED") or "", spark.conf.get(INT96_REBASE_CONF, "CORRECTED") or "")
    conversion = str(spark.conf.get("spark.sql.parquet.int96TimestampConversion", "false")).lower() == "true"
    read = ParquetReader(
        fs if driver else for_executors(fs),
        _arrow(schema),
        row_index,
        known,
        dict(loaded or {}),
        damaged,
        rebase,
        conversion,
    )
    return _scan(spark, fs, paths, _with_row_index(schema, row_index), read, file_column, driver)


def read_records(
    spark: SparkSession,
    fs: fsspec.AbstractFileSystem,
    paths: Sequence[str],
    format: str,
    declared: StructType,
    options: dict[str, str],
    corrupt: str,
    file_column: FileColumn | None = None,
    engine: str | None = None,
    sizes: Sequence[int] | None = None,
) -> DataFrame:
    """The records of the JSON Lines or CSV files ``paths``, parsed permissively: ``declared``'s columns
    and ``corrupt``, the raw text of a malformed record (:mod:`.records`).

    ``sizes`` (bytes, one per path): the Python engine fails a read that does not get exactly
    that many bytes of the file, so a store answering short is never taken for a file's end.
    """
    from pyspark.sql.types import StringType, StructField, StructType

    schema = as_nullable(StructType([*declared.fields, StructField(corrupt, StringType(), True)]))
    if engine_for(spark, fs, engine) == "hadoop":
        reader = spark.read.format(format).options(**options)
        if format == "csv":
            reader = reader.option("header", options.get("header", "true"))
        reader = reader.schema(schema).option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", corrupt)
        return _with_path_column(reader.load([url(fs, p) for p in paths]), file_column)
    from airflow_provider_checkpoint.fileio.records import converters

    check_options(format, options)
    converters(_arrow(declared), text=format == "csv")  # refuses unsupported column types in the driver
    expected = dict(zip(paths, sizes, strict=True)) if sizes is not None else {}
    driver = on_driver(sizes)
    parse = RecordReader(fs if driver else for_executors(fs), format, _arrow(schema), options, expected)
    return _scan(spark, fs, paths, schema, parse, file_column, driver)


def read_files(
    spark: SparkSession,
    fs: fsspec.AbstractFileSystem,
    sizes: Mapping[str, int],
    format: str,
    declared: StructType,
    options: dict[str, str],
    corrupt: str,
    file_column: FileColumn | None = None,
    ordered: bool = False,
) -> DataFrame:
    """The files ``sizes`` (path → size in bytes, known beforehand) of ``format`` with the ``declared``
    columns: Parquet by :func:`read_parquet`, JSON Lines or CSV parsed permissively by :func:`read_records`.
    ``ordered``: the partitions hold the rows in source order, files by path, each file's rows in file order
    (:func:`in_file_order`)."""

    def scan(files: list[str], column: FileColumn | None) -> DataFrame:
        counted = [sizes[f] for f in files]
        if format == "parquet":
            return read_parquet(spark, fs, files, declared, column, options=options, sizes=counted)
        return read_records(spark, fs, files, format, declared, options, corrupt, column, sizes=counted)

    paths = sorted(sizes)
    if ordered and len(paths) > 1 and engine_for(spark, fs) == "hadoop":
        return in_file_order(scan, fs, paths)
    return scan(paths, file_column)


def on_driver(sizes: Sequence[int] | None) -> bool:
    """Whether a Python read of files of these ``sizes`` runs on the driver (:data:`DRIVER_READ_BYTES`)."""
    return sizes is not None and sum(sizes) <= DRIVER_READ_BYTES


def in_file_order(
    scan: Callable[[list[str], FileColumn | None], DataFrame], fs: fsspec.AbstractFileSystem, paths: Sequence[str]
) -> DataFrame:
    """``scan(files, file_column)`` (a Spark scan of ``files`` on ``fs``, naming each row's file in
    ``file_column`` if given) of ``paths`` in source order: the partitions hold the files in the
    order of ``paths``, each file's rows in file order.

    A Spark file scan packs its files into partitions largest first, so a scan of several files
    does not keep their order; within a file, the rows (and the splits of a large file) keep
    theirs. Up to :data:`ORDERED_SCAN_FILES` files are scanned one by one and concatenated
    (a union keeps its inputs' partitions in order; planning costs ~50 ms a file). More files
    are scanned at once and range-sorted on ``(file, position in the scan)`` (one sampling
    job and one shuffle). The python engine reads in order already.
    """
    from pyspark.sql import functions as F

    if len(paths) <= ORDERED_SCAN_FILES:
        return reduce(lambda a, b: a.union(b), [scan([p], None) for p in paths])
    column = FileColumn(_FILE)
    rank = F.element_at(
        F.create_map(*[F.lit(x) for i, path in enumerate(paths) for x in (column.key(fs, path), i)]),
        column.key_column(),
    )
    positioned = scan(list(paths), column).withColumn(_POSITION, F.monotonically_increasing_id())
    return positioned.orderBy(rank, F.col(_POSITION)).drop(_POSITION, _FILE)


ORDERED_SCAN_FILES = 32
"""An ordered read of at most this many files scans them one by one (:func:`in_file_order`)."""
_FILE, _POSITION = "__file_in_scan", "__position_in_scan"
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:/*")


def footer_schema(fs: fsspec.AbstractFileSystem, path: str) -> StructType:
    """The Spark schema of the Parquet file ``path`` (from its footer)."""
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import from_arrow_schema

    with fs.open(path, "rb") as f:
        return from_arrow_schema(pq.read_schema(f))


def _arrow(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


@dataclass(frozen=True)
class FileColumn:
    """A column naming each row's file: its URL (``path``, percent-encoded as Spark's ``_metadata.file_path``)
    or its base name (``name``, as ``_metadata.file_name``)."""

    name: str
    part: str = "path"

    def label(self, fs: fsspec.AbstractFileSystem, path: str) -> str:
        return quote(url(fs, path), safe=":/") if self.part == "path" else posixpath.basename(path)

    def key(self, fs: fsspec.AbstractFileSystem, path: str) -> str:
        """:meth:`label` without scheme and leading slashes, as :meth:`key_column` gives it: Spark names
        a local file ``file:/x``, fsspec's URL is ``file:///x``."""
        return _SCHEME.sub("", self.label(fs, path))

    def key_column(self) -> Column:
        """This column without scheme and leading slashes, to compare with :meth:`key`."""
        from pyspark.sql import functions as F

        return F.regexp_replace(F.col(self.name), _SCHEME.pattern, "")


def _with_file(schema: StructType, file_column: FileColumn | None) -> StructType:
    from pyspark.sql.types import StringType, StructField, StructType

    return StructType([*schema.fields, *([StructField(file_column.name, StringType())] if file_column else [])])


def _with_row_index(schema: StructType, row_index: str | None) -> StructType:
    from pyspark.sql.types import LongType, StructField, StructType

    return StructType([*schema.fields, *([StructField(row_index, LongType())] if row_index else [])])


def _with_path_column(df: DataFrame, file_column: FileColumn | None) -> DataFrame:
    from pyspark.sql import functions as F

    return df.withColumn(file_column.name, F.col(f"_metadata.file_{file_column.part}")) if file_column else df


def as_nullable(schema: StructType) -> StructType:
    """``schema`` with every column and nested value nullable, as Spark's file sources read any schema."""
    from pyspark.sql.types import StructType

    def loosen(value: Any) -> Any:
        if isinstance(value, dict):
            flags = ("nullable", "containsNull", "valueContainsNull")
            return {k: True if k in flags else loosen(v) for k, v in value.items()}
        return [loosen(v) for v in value] if isinstance(value, list) else value

    return StructType.fromJson(loosen(schema.jsonValue()))


def _scan(
    spark: SparkSession,
    fs: fsspec.AbstractFileSystem,
    paths: Sequence[str],
    schema: StructType,
    read: Callable[[str], Iterator[pa.RecordBatch]],
    file_column: FileColumn | None,
    driver: bool,
) -> DataFrame:
    """The files read by ``read`` (:class:`FileScan`) on the driver (``driver``) or on the executors, one
    row of ids per file; ``schema`` nullable."""
    import pyarrow as pa

    labels = [file_column.label(fs, p) for p in paths] if file_column else None
    scan = FileScan(list(paths), read, labels, file_column.name if file_column else "")
    out = _with_file(schema, file_column)
    if driver:
        ids = pa.record_batch([pa.array(range(len(paths)), pa.int64())], names=["id"])
        return arrow_frame(spark, pa.Table.from_batches(list(scan(iter([ids]))), _arrow(out)), out)
    tasks = min(len(paths), MAX_READ_TASKS)
    return spark.range(0, len(paths), 1, tasks).mapInArrow(scan, out)


@dataclass(frozen=True)
class FileScan:
    """The executor side of a ``python`` read: the files whose indexes reach the task, batch by batch."""

    paths: list[str]
    read: Callable[[str], Iterator[pa.RecordBatch]]
    labels: list[str] | None
    file_column: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        for batch in batches:
            for index in batch.column(0).to_pylist():
                for out in self.read(self.paths[index]):
                    if self.labels is not None:
                        where = pa.array([self.labels[index]] * out.num_rows, pa.string())
                        out = pa.RecordBatch.from_arrays([*out.columns, where], [*out.schema.names, self.file_column])
                    yield out
