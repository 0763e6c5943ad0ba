"""A Kafka sink's staged records: written by the executors, one Parquet file per Spark partition, read
back by the commit in the committable's order.

Each Spark task of the step turns its rows (the staged columns, :func:`staged_schema`, every value
already bytes) into one Parquet file ``<attempt dir>/kafka-<uid>/part-<partition>-a<task attempt>.parquet``
through fsspec and pyarrow, hashing it on the way, and reports one manifest row: the file, its size,
records and checksum, its largest record and how many exceed the limit, its lowest and highest
partition column value. The driver collects only the manifest. A task with no rows writes nothing;
a failed or retried task attempt's file is never listed.

The committable lists the files by Spark partition, which is the input's order: the commit produces
the files' records in that order, the same records in the same order however often it runs again
(after a crash, on recovery, after a restore). Files are untrusted on read: each path must be a staged
file of this sink inside one attempt directory of its checkpoint, and its size, checksum, columns and
record count must be what the committable says.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.core.checksums import checksum_of
from airflow_provider_checkpoint.exceptions import DocumentError

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_provider_checkpoint.storage import JobStorage

MANIFEST = (
    "partition long, path string, size long, records long, checksum string, largest long, over long, "
    "low long, high long"
)
"""What each Spark task of a staging reports (one row per file written)."""


def staged_schema() -> pa.Schema:
    """The columns a staged file has, in order: what the step writes and the commit accepts."""
    import pyarrow as pa

    header = pa.struct([("key", pa.string()), ("value", pa.binary())])
    return pa.schema(
        [("key", pa.binary()), ("value", pa.binary()), ("headers", pa.list_(header)), ("partition", pa.int32())]
    )


@dataclass
class _Watch:
    """What passed through a task: its largest record, how many exceed ``limit``, the partition column's range."""

    limit: int
    largest: int = 0
    over: int = 0
    low: int | None = None
    high: int | None = None

    def batches(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        import pyarrow.compute as pc

        from airflow_provider_checkpoint.connectors.kafka.sizes import record_sizes

        schema = staged_schema()
        for batch in batches:
            if batch.num_rows == 0:
                continue
            table = pa.Table.from_batches([batch]).cast(schema)
            sizes = record_sizes(table)
            self.largest = max(self.largest, int(sizes.max()))
            self.over += int((sizes > self.limit).sum())
            low, high = (v.as_py() for v in pc.min_max(table["partition"]).values())
            if low is not None:
                self.low = low if self.low is None else min(self.low, low)
                self.high = high if self.high is None else max(self.high, high)
            yield from table.to_batches()


@dataclass(frozen=True)
class StageTask:
    """The ``mapInArrow`` function of a staging: a task's rows into one file under ``directory`` on ``fs``,
    one :data:`MANIFEST` row out (none for a task without rows). ``limit``: the largest record the topic
    and the producer accept."""

    fs: Any = field(repr=False)
    directory: str
    limit: int

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from pyspark import TaskContext

        from airflow_provider_checkpoint.fileio.writes import ParquetTask

        context = TaskContext.get()
        assert context is not None, "runs in a Spark task"
        partition = context.partitionId()
        watch = _Watch(self.limit)
        stem = f"part-{partition:05d}-a{context.taskAttemptId()}.parquet"
        written = ParquetTask(self.fs, self.directory, (), "snappy").files(watch.batches(batches), stem)
        for path, size, records, checksum, _ in written:
            row = (partition, path, size, records, checksum, watch.largest, watch.over, watch.low, watch.high)
            types = [pa.string() if isinstance(v, str) else pa.int64() for v in row]
            names = [f.split()[0] for f in MANIFEST.split(", ")]
            yield pa.RecordBatch.from_arrays([pa.array([v], t) for v, t in zip(row, types, strict=True)], names)


def file_pattern(uid: str) -> str:
    """The regular expression of a staged file of sink ``uid`` (relative to the job's storage)."""
    import re

    return rf"^chk-\d+/[A-Za-z0-9_.-]+/attempt-\d+/kafka-{re.escape(uid)}/part-\d{{5}}-a\d+\.parquet$"


def check_layout(files: list[str], document: str, where: str) -> None:
    """``files`` (each already matching :func:`file_pattern`) lie in one directory, by increasing partition."""
    if len({posixpath.dirname(f) for f in files}) > 1:
        raise DocumentError(document, where, "must all lie in one attempt directory", files)
    parts = [int(posixpath.basename(f)[5:10]) for f in files]
    if any(a >= b for a, b in zip(parts, parts[1:], strict=False)):
        raise DocumentError(document, where, "must be listed by strictly increasing partition", files)


def read_files(storage: JobStorage, files: list[dict[str, Any]], document: str, where: str) -> pa.Table:
    """The staged records of ``files`` (``{file, size, records, checksum}`` each, checked), in their order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = []
    for i, entry in enumerate(files):
        name = f"{where}.files[{i}]"
        data = storage.read_bytes(entry["file"])
        if len(data) != entry["size"]:
            raise DocumentError(document, f"{name}.size", f"the file has {len(data)} bytes", entry["size"])
        if checksum_of([data]) != entry["checksum"]:
            raise DocumentError(document, f"{name}.checksum", "is not the file's checksum", entry["file"])
        try:
            table = pq.read_table(pa.BufferReader(data))
            if table.schema.names != staged_schema().names:
                raise ValueError(f"columns {table.schema.names}")
            table = table.cast(staged_schema())
        except (pa.ArrowException, ValueError) as e:
            raise DocumentError(document, f"{name}.file", f"is not a staged record file: {e}") from e
        if table.num_rows != entry["records"]:
            raise DocumentError(document, f"{name}.records", f"the file holds {table.num_rows}", entry["records"])
        tables.append(table)
    return pa.concat_tables(tables) if tables else staged_schema().empty_table()
