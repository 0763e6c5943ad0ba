"""Spark's file I/O on any fsspec filesystem: state, channels, sink staging and file sources.

Two engines do the same work:

- ``hadoop``: Spark's own Parquet/JSON/CSV readers and writers on the file's URL. Always
  for local paths (``file://``); for another scheme when the session configures a Hadoop
  filesystem for it (``spark.hadoop.fs.<scheme>.impl``) or lists the scheme in
  :data:`HADOOP_SCHEMES_CONF` (a connector set up in ``core-site.xml``).
- ``python``: everything else (``s3://`` with the plain ``pyspark`` wheel, which has no
  ``s3a``). Executors open the files through fsspec and pyarrow: each Spark task of a
  write streams its rows into Parquet files (``mapInArrow``) named after the task attempt,
  hashes them on the way and reports them; a read is one task per file (up to
  :data:`MAX_READ_TASKS`) parsing it with pyarrow or :mod:`.text_records`.

The filesystem, and with it its credentials (storage options or the AWS environment of
the driver), reaches the executors inside the pickled task, never in a document, a
Spark option or a log line. A write counts only the files the successful attempt of
each task reported: a failed or retried attempt's file is never listed (it stays in the
attempt's directory, deleted with it).
"""

from __future__ import annotations

import hashlib
import posixpath
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from airflow_provider_checkpoint.storage.job_storage import file_checksum
from airflow_provider_checkpoint.storage.paths import is_local

if TYPE_CHECKING:
    import fsspec
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

HADOOP_SCHEMES_CONF = "spark.checkpoint.hadoopSchemes"
"""Comma-separated URL schemes Spark's Hadoop layer serves though no ``spark.hadoop.fs.<scheme>.impl`` says so."""
ENGINE_CONF = "spark.checkpoint.fileEngine"
"""``hadoop`` or ``python`` forces that engine for every scheme (``auto``, the default, chooses per scheme)."""
ENGINES = ("hadoop", "python")
MAX_READ_TASKS = 256
"""A Python read spreads its files over at most this many tasks."""
BUFFER_ROWS = 1 << 20
"""A Python write buffers up to this many rows per file before writing them as one row group."""
BATCH_ROWS = 65_536
"""Rows per Arrow batch a Python read hands to Spark."""
_WRITTEN = "path string, size long, rows long, checksum string, partition string"


@dataclass(frozen=True)
class WrittenFile:
    """A Parquet file a write produced: ``path`` on the filesystem, its ``size``; ``rows`` and ``checksum``
    when the writer knew them (``python``); ``partition``: its ``partition_by`` values (``None``: null)."""

    path: str
    size: int
    rows: int | None = None
    checksum: str | None = None
    partition: tuple[str | None, ...] = ()

    def sha256(self, fs: fsspec.AbstractFileSystem) -> str:
        """Its checksum (``sha256:<hex>``), read back from ``fs`` unless the writer computed it."""
        return self.checksum or file_checksum(fs, self.path)

    def row_count(self, fs: fsspec.AbstractFileSystem) -> int:
        """Its rows, from its Parquet footer unless the writer counted them."""
        if self.rows is not None:
            return self.rows
        import pyarrow.parquet as pq

        with fs.open(self.path, "rb") as f:
            return int(pq.ParquetFile(f).metadata.num_rows)


def scheme(fs: fsspec.AbstractFileSystem) -> str:
    """The URL scheme of ``fs`` (``file`` for local filesystems)."""
    if is_local(fs):
        return "file"
    protocol = fs.protocol
    return str(protocol[0] if isinstance(protocol, tuple) else protocol)


def url(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """The URL of ``path`` on ``fs``."""
    return f"{scheme(fs)}://{path}"


def engine_for(spark: SparkSession, fs: fsspec.AbstractFileSystem, engine: str | None = None) -> str:
    """``engine`` if given, else :data:`ENGINE_CONF` unless ``auto``, else ``hadoop`` where Spark's Hadoop
    layer serves ``fs``'s scheme, else ``python``."""
    configured = str(spark.conf.get(ENGINE_CONF, "auto") or "auto")
    engine = engine or (None if configured == "auto" else configured)
    if engine is not None:
        if engine not in ENGINES:
            raise ValueError(f"{ENGINE_CONF} must be auto or one of {ENGINES}, got {engine!r}")
        return engine
    name = scheme(fs)
    listed = {s.strip() for s in str(spark.conf.get(HADOOP_SCHEMES_CONF, "") or "").split(",")}
    if name == "file" or name in listed or spark.conf.get(f"spark.hadoop.fs.{name}.impl", None):
        return "hadoop"
    return "python"


# -- writing -----------------------------------------------------------------------------
def write_parquet(
    df: DataFrame,
    fs: fsspec.AbstractFileSystem,
    directory: str,
    partition_by: Sequence[str] = (),
    engine: str | None = None,
) -> list[WrittenFile]:
    """Write ``df`` as Parquet files under ``directory`` (a new directory on ``fs``), sorted by path.

    ``partition_by``: subdirectories ``<column>=<value>`` per value, the columns left out
    of the files, as Spark writes them. Each task writes one file per partition it holds; a
    task with no rows writes nothing.
    """
    if engine_for(df.sparkSession, fs, engine) == "hadoop":
        writer = df.write.partitionBy(*partition_by) if partition_by else df.write
        writer.parquet(url(fs, directory))
        return written_by_spark(fs, directory)
    codec = str(df.sparkSession.conf.get("spark.sql.parquet.compression.codec", "snappy"))
    task = ParquetTask(fs, directory, tuple(partition_by), "none" if codec == "uncompressed" else codec)
    found = df.mapInArrow(task, _WRITTEN).collect()
    files = (WrittenFile(r.path, r.size, r.rows, r.checksum, partition_values(r.partition)) for r in found)
    return sorted(files, key=lambda f: f.path)


def written_by_spark(fs: fsspec.AbstractFileSystem, directory: str) -> list[WrittenFile]:
    """The data files Spark's writer left under ``directory`` (``part-*.parquet``, partition from the directory)."""
    found = fs.find(directory, detail=True)
    files = []
    for path, info in sorted(found.items()):
        if info["type"] == "file" and posixpath.basename(path).startswith("part-") and path.endswith(".parquet"):
            within = posixpath.relpath(posixpath.dirname(path), directory)
            files.append(WrittenFile(path, int(info["size"]), partition=partition_values(within)))
    return files


def partition_values(within: str) -> tuple[str | None, ...]:
    """The partition values of the directories ``within`` (``a=1/b=x``, relative to the written directory)."""
    dirs = [d for d in within.split("/") if d not in ("", ".")]
    values = [unquote(d.split("=", 1)[1]) if "=" in d else d for d in dirs]
    return tuple(None if v == HIVE_NULL else v for v in values)


class _HashingFile:
    """A writable file that hashes and counts what passes through it."""

    def __init__(self, target: Any) -> None:
        self.target, self.digest, self.size, self.closed = target, hashlib.sha256(), 0, False

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        self.size += len(data)
        self.target.write(data)
        return len(data)

    def tell(self) -> int:
        return self.size

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        self.target.flush()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.target.close()


class _PartFile:
    """One Parquet file a task writes: rows buffered to :data:`BUFFER_ROWS` per row group."""

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str, compression: str) -> None:
        self.fs, self.path, self.compression = fs, path, compression
        self.pending: list[pa.Table] = []
        self.buffered = self.rows = 0
        self.file: _HashingFile | None = None
        self.writer: Any = None

    def add(self, table: pa.Table) -> None:
        self.pending.append(table)
        self.buffered += table.num_rows
        if self.buffered >= BUFFER_ROWS:
            self.flush()

    def flush(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self.pending:
            return
        table = pa.concat_tables(self.pending)
        if self.writer is None:
            if is_local(self.fs):  # object stores have no directories to make
                self.fs.makedirs(posixpath.dirname(self.path), exist_ok=True)
            self.file = _HashingFile(self.fs.open(self.path, "wb"))
            self.writer = pq.ParquetWriter(self.file, table.schema, compression=self.compression)
        self.writer.write_table(table, row_group_size=max(1, table.num_rows))
        self.rows += table.num_rows
        self.pending, self.buffered = [], 0

    def close(self) -> tuple[str, int, int, str]:
        self.flush()
        self.writer.close()
        assert self.file is not None
        self.file.close()
        return self.path, self.file.size, self.rows, "sha256:" + self.file.digest.hexdigest()


@dataclass(frozen=True)
class ParquetTask:
    """The executor side of a ``python`` write: a task's Arrow batches into its Parquet files, one row per file out."""

    fs: Any
    directory: str
    partition_by: tuple[str, ...]
    compression: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None, "runs in a Spark task"
        stem = f"part-{context.partitionId():05d}-a{context.taskAttemptId()}-{uuid.uuid4().hex[:8]}.parquet"
        files: dict[str, _PartFile] = {}
        for batch in batches:
            for within, table in split_by(pa.Table.from_batches([batch]), self.partition_by):
                if within not in files:
                    path = posixpath.join(self.directory, within, stem)
                    files[within] = _PartFile(self.fs, path, self.compression)
                files[within].add(table)
        written = [(*files[within].close(), within) for within in sorted(files)]
        yield pa.RecordBatch.from_pylist(
            [dict(zip(("path", "size", "rows", "checksum", "partition"), w, strict=True)) for w in written],
            schema=pa.schema(
                [
                    ("path", pa.string()),
                    ("size", pa.int64()),
                    ("rows", pa.int64()),
                    ("checksum", pa.string()),
                    ("partition", pa.string()),
                ]
            ),
        )


HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def split_by(table: pa.Table, columns: Sequence[str]) -> Iterator[tuple[str, pa.Table]]:
    """``(partition directories, rows without the columns)`` per distinct value of ``columns`` in ``table``
    (``("", table)`` without columns): ``a=1/b=x``, values escaped, null as Hive writes it."""
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return
    if not columns:
        yield "", table
        return
    rest = table.drop_columns(list(columns))
    if len(columns) == 1:
        combinations = [(v,) for v in pc.unique(table.column(columns[0])).to_pylist()]
    else:  # in order of first occurrence
        combinations = list(dict.fromkeys(zip(*[table.column(c).to_pylist() for c in columns], strict=True)))
    for combination in combinations:
        mask = None
        for column, value in zip(columns, combination, strict=True):
            found = table.column(column)
            match = pc.is_null(found) if value is None else pc.equal(found, value)
            mask = match if mask is None else pc.and_(mask, match)
        within = "/".join(f"{c}={partition_text(v)}" for c, v in zip(columns, combination, strict=True))
        yield within, rest.filter(mask)


def partition_text(value: Any) -> str:
    """A partition value as its directory name holds it: escaped, null as Hive writes it."""
    return HIVE_NULL if value is None else quote(str(value), safe=" ")


# -- reading -----------------------------------------------------------------------------
def read_parquet(
    spark: SparkSession,
    fs: fsspec.AbstractFileSystem,
    paths: Sequence[str],
    schema: StructType | None = None,
    file_column: FileColumn | None = None,
    engine: str | None = None,
) -> DataFrame:
    """The rows of the Parquet files ``paths`` on ``fs`` with ``schema`` (a column a file lacks is null;
    ``None``: the first file's columns).

    ``file_column``: also a column naming each row's file (:class:`FileColumn`).
    """
    if not paths:
        if schema is None:
            raise ValueError("reading no files needs their schema")
        return spark.createDataFrame([], _with_file(schema, file_column))
    if engine_for(spark, fs, engine) == "hadoop":
        reader = spark.read.schema(schema) if schema is not None else spark.read
        return _with_path_column(reader.parquet(*[url(fs, p) for p in paths]), file_column)
    if schema is None:
        schema = footer_schema(fs, paths[0])
    return _scan(spark, fs, paths, schema, ParquetReader(fs, _arrow(schema)), file_column)


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
) -> DataFrame:
    """The records of the JSON Lines or CSV files ``paths``, parsed permissively: ``declared``'s columns
    and ``corrupt``, the raw text of a malformed record (:mod:`.text_records`)."""
    from pyspark.sql.types import StringType, StructField, StructType

    schema = StructType([*declared.fields, StructField(corrupt, StringType(), True)])
    if engine_for(spark, fs, engine) == "hadoop":
        reader = spark.read.format(format).options(**options)
        if format == "csv":
            reader = reader.option("header", options.get("header", "true"))
        reader = reader.schema(schema).option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", corrupt)
        return _with_path_column(reader.load([url(fs, p) for p in paths]), file_column)
    from airflow_provider_checkpoint.dataflow.text_records import check_options, converters

    check_options(format, options)
    converters(_arrow(declared), text=format == "csv")  # refuses unsupported column types in the driver
    return _scan(spark, fs, paths, schema, RecordReader(fs, format, _arrow(schema), options), file_column)


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


def _with_file(schema: StructType, file_column: FileColumn | None) -> StructType:
    from pyspark.sql.types import StringType, StructField, StructType

    return StructType([*schema.fields, *([StructField(file_column.name, StringType())] if file_column else [])])


def _with_path_column(df: DataFrame, file_column: FileColumn | None) -> DataFrame:
    from pyspark.sql import functions as F

    return df.withColumn(file_column.name, F.col(f"_metadata.file_{file_column.part}")) if file_column else df


def _scan(
    spark: SparkSession,
    fs: fsspec.AbstractFileSystem,
    paths: Sequence[str],
    schema: StructType,
    read: Callable[[str], Iterator[pa.RecordBatch]],
    file_column: FileColumn | None,
) -> DataFrame:
    """One row of ids per file, read by ``read`` on the executors (:class:`FileScan`)."""
    labels = [file_column.label(fs, p) for p in paths] if file_column else None
    tasks = min(len(paths), MAX_READ_TASKS)
    scan = FileScan(list(paths), read, labels, file_column.name if file_column else "")
    return spark.range(0, len(paths), 1, tasks).mapInArrow(scan, _with_file(schema, file_column))


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


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with exactly ``schema``'s columns, cast to their types (a missing column is null)."""
    import pyarrow as pa

    names = batch.schema.names
    columns = [
        batch.column(names.index(f.name)).cast(f.type) if f.name in names else pa.nulls(batch.num_rows, f.type)
        for f in schema
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


@dataclass(frozen=True)
class ParquetReader:
    """A Parquet file's rows in batches of ``schema``."""

    fs: Any
    schema: pa.Schema

    def __call__(self, path: str) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq

        with self.fs.open(path, "rb") as f:
            file = pq.ParquetFile(f)
            present = [n for n in self.schema.names if n in file.schema_arrow.names]
            for batch in file.iter_batches(batch_size=BATCH_ROWS, columns=present):
                yield conform(batch, self.schema)


@dataclass(frozen=True)
class RecordReader:
    """A JSON Lines or CSV file's records in batches of ``schema`` (the declared columns, then the corrupt one)."""

    fs: Any
    format: str
    schema: pa.Schema
    options: dict[str, str]

    def __call__(self, path: str) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        from airflow_provider_checkpoint.dataflow.text_records import records

        declared = pa.schema(list(self.schema)[:-1])
        empty = [None] * len(declared)
        rows: list[list[Any]] = []
        with self.fs.open(path, "rt", encoding="utf-8", errors="replace", compression="infer") as f:
            for values, raw in records(f, self.format, declared, self.options):
                rows.append([*values, None] if values is not None else [*empty, raw])
                if len(rows) == BATCH_ROWS:
                    yield _batch(rows, self.schema)
                    rows = []
        if rows:
            yield _batch(rows, self.schema)


def _batch(rows: list[list[Any]], schema: pa.Schema) -> pa.RecordBatch:
    import pyarrow as pa

    columns = [pa.array([r[i] for r in rows], type=f.type) for i, f in enumerate(schema)]
    return pa.RecordBatch.from_arrays(columns, schema=schema)
