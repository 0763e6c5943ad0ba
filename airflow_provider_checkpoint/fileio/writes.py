"""Spark's file I/O on any fsspec filesystem: state, channels, sink staging and file sources.

Two engines do the same work:

- ``hadoop``: Spark's own Parquet/JSON/CSV readers and writers on the file's URL. Always
  for local paths (``file://``); for another scheme when the session configures a Hadoop
  filesystem for it (``spark.hadoop.fs.<scheme>.impl``) or lists the scheme in
  :data:`HADOOP_SCHEMES_CONF` (a connector set up in ``core-site.xml``).
- ``python``: everything else (``s3://`` with the plain ``pyspark`` wheel, which has no
  ``s3a``). Executors open the files through fsspec and pyarrow: each Spark task of a
  write streams its rows into Parquet files (``mapInArrow``) named after the task attempt,
  hashes them on the way and reports them; reads: :mod:`.scans`.

The filesystem, and with it its credentials (storage options or the AWS environment of
the driver), reaches the executors inside the pickled task, never in a document, a
Spark option or a log line. A write counts only the files the successful attempt of
each task reported: a failed or retried attempt's file is never listed (it stays in the
attempt's directory, deleted with it).
"""

from __future__ import annotations

import posixpath
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from airflow_provider_checkpoint.core.checksums import Checksum
from airflow_provider_checkpoint.storage.job_storage import file_checksum
from airflow_provider_checkpoint.storage.object_store import for_executors
from airflow_provider_checkpoint.storage.paths import is_local

if TYPE_CHECKING:
    import fsspec
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

HADOOP_SCHEMES_CONF = "spark.checkpoint.hadoopSchemes"
"""Comma-separated URL schemes Spark's Hadoop layer serves though no ``spark.hadoop.fs.<scheme>.impl`` says so."""
ENGINE_CONF = "spark.checkpoint.fileEngine"
"""``hadoop`` or ``python`` forces that engine for every scheme (``auto``, the default, chooses per scheme)."""
ENGINES = ("hadoop", "python")
BUFFER_ROWS = 1 << 20
"""A Python write buffers up to this many rows per file before writing them as one row group."""
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
    held: pa.Table | None = None,
) -> list[WrittenFile]:
    """Write ``df`` as Parquet files under ``directory`` (a new directory on ``fs``), sorted by path.

    ``partition_by``: subdirectories ``<column>=<value>`` per value, the columns left out
    of the files, as Spark writes them. Each task writes one file per partition it holds; a
    task with no rows writes nothing. ``held``: ``df``'s rows as the driver holds them already
    (the same columns; e.g. merged there): the ``python`` engine writes them from the driver, one
    file per partition, with no Spark job and no Python worker.
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    if engine_for(df.sparkSession, fs, engine) == "hadoop":
        writer = df.write.partitionBy(*partition_by) if partition_by else df.write
        writer.parquet(url(fs, directory))
        return written_by_spark(fs, directory)
    codec = str(df.sparkSession.conf.get("spark.sql.parquet.compression.codec", "snappy"))
    compression = "none" if codec == "uncompressed" else codec
    if held is not None and held.schema.names == df.columns:
        rows = held.cast(to_arrow_schema(df.schema, timezone="UTC"))  # as Spark would hand them over
        stem = f"part-00000-driver-{uuid.uuid4().hex[:8]}.parquet"
        found = ParquetTask(fs, directory, tuple(partition_by), compression).files(rows.to_batches(), stem)
    else:
        task = ParquetTask(for_executors(fs), directory, tuple(partition_by), compression)
        found = [tuple(r) for r in df.mapInArrow(task, _WRITTEN).collect()]
    files = (
        WrittenFile(path, size, rows, checksum, partition_values(within))
        for path, size, rows, checksum, within in found
    )
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
        self.target, self.checksum, self.size, self.closed = target, Checksum(), 0, False

    def write(self, data: bytes) -> int:
        self.checksum.update(data)
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
            self.writer = pq.ParquetWriter(  # page CRCs: files kept from older checkpoints are checked on read
                self.file, table.schema, compression=self.compression, write_page_checksum=True
            )
        self.writer.write_table(table, row_group_size=max(1, table.num_rows))
        self.rows += table.num_rows
        self.pending, self.buffered = [], 0

    def close(self) -> tuple[str, int, int, str]:
        self.flush()
        self.writer.close()
        assert self.file is not None
        self.file.close()
        return self.path, self.file.size, self.rows, self.file.checksum.value


@dataclass(frozen=True)
class ParquetTask:
    """The executor side of a ``python`` write: a task's Arrow batches into its Parquet files, one row per file out."""

    fs: Any = field(repr=False)
    directory: str
    partition_by: tuple[str, ...]
    compression: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None, "runs in a Spark task"
        stem = f"part-{context.partitionId():05d}-a{context.taskAttemptId()}-{uuid.uuid4().hex[:8]}.parquet"
        written = self.files(batches, stem)
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

    def files(self, batches: Iterable[pa.RecordBatch], stem: str) -> list[tuple[str, int, int, str, str]]:
        """``batches`` written as files named ``stem``, one per partition: (path, size, rows, checksum, partition
        directories) of each, by partition."""
        import pyarrow as pa

        files: dict[str, _PartFile] = {}
        for batch in batches:
            for within, table in split_by(pa.Table.from_batches([batch]), self.partition_by):
                if within not in files:
                    path = posixpath.join(self.directory, within, stem)
                    files[within] = _PartFile(self.fs, path, self.compression)
                files[within].add(table)
        return [(*files[within].close(), within) for within in sorted(files)]


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
    if len(combinations) == 1:  # one partition in the batch, as a task writing one range has: no copy
        yield _within(columns, combinations[0]), rest
        return
    for combination in combinations:
        mask = None
        for column, value in zip(columns, combination, strict=True):
            found = table.column(column)
            match = pc.is_null(found) if value is None else pc.equal(found, value)
            mask = match if mask is None else pc.and_(mask, match)
        yield _within(columns, combination), rest.filter(mask)


def _within(columns: Sequence[str], values: Sequence[Any]) -> str:
    return "/".join(f"{c}={partition_text(v)}" for c, v in zip(columns, values, strict=True))


def partition_text(value: Any) -> str:
    """A partition value as its directory name holds it: escaped, null as Hive writes it."""
    return HIVE_NULL if value is None else quote(str(value), safe=" ")
