"""The executor side of a ``python`` read (:mod:`.scans`): one file's rows in Arrow batches of the requested
schema, a Parquet file through pyarrow (:class:`ParquetReader`), a JSON Lines or CSV file parsed
permissively (:class:`RecordReader`, :mod:`.records`). A file that fails to decode is named in the error."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.fileio.parquet_types import conform, file_columns, rebase_modes
from airflow_provider_checkpoint.fileio.writes import url
from airflow_provider_checkpoint.storage.object_store import open_sized

if TYPE_CHECKING:
    import fsspec
    import pyarrow as pa

CORRUPT = "corrupt Parquet file"
"""How a Parquet file that fails to decode is named in the error (:func:`named_if_corrupt`)."""
BATCH_ROWS = 65_536
"""Rows per Arrow batch a Python read hands to Spark."""


@dataclass(frozen=True)
class ParquetReader:
    """A Parquet file's rows in batches of ``schema``, with each row's position in the file as ``row_index``
    if named."""

    fs: Any = field(repr=False)
    schema: pa.Schema
    row_index: str | None = None
    sizes: dict[str, int] = field(default_factory=dict)
    """path → its size when known (:func:`~.object_store.open_sized`)."""
    loaded: dict[str, bytes] = field(default_factory=dict, repr=False)
    """path → the file's bytes, read (and checked) by the driver: shipped with the task, no request."""
    damaged: str = CORRUPT
    """What a file that fails to decode is called in the error naming it."""
    rebase: tuple[str, str] = ("CORRECTED", "CORRECTED")
    """The session's rebase modes in read of dates and timestamps, and of INT96 timestamps."""
    int96_conversion: bool = False
    """The session's ``spark.sql.parquet.int96TimestampConversion``: INT96 columns are then refused."""

    def __call__(self, path: str) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        position = 0
        where = url(self.fs, path)
        data = self.loaded.get(path)
        with pa.BufferReader(data) if data is not None else open_sized(self.fs, path, self.sizes.get(path)) as f:
            with named_if_corrupt(self.fs, path, self.damaged):
                # page checksums as the session's Parquet reader; INT96 in microseconds, rounded down as Spark does
                file = pq.ParquetFile(f, page_checksum_verification=True, coerce_int96_timestamp_unit="us")
                names = file_columns(file.schema_arrow.names, self.schema.names, where)
                modes = rebase_modes(file, names, self.schema, where, self.rebase, self.int96_conversion)
                batches = file.iter_batches(batch_size=BATCH_ROWS, columns=list(names))
            while True:
                with named_if_corrupt(self.fs, path, self.damaged):
                    batch = next(batches, None)
                if batch is None:
                    return
                out = conform(batch, names, self.schema, modes, where)
                if self.row_index:
                    rows = pa.array(range(position, position + out.num_rows), pa.int64())
                    out = pa.RecordBatch.from_arrays([*out.columns, rows], [*out.schema.names, self.row_index])
                position += batch.num_rows
                yield out


@contextmanager
def named_if_corrupt(fs: fsspec.AbstractFileSystem, path: str, damaged: str = CORRUPT) -> Iterator[None]:
    """Reading ``path`` inside: a damaged page (CRC) or structure (its footer's Thrift) raises an ``OSError``
    ``"<damaged> <file URL>: <why>"``."""
    import pyarrow as pa

    try:
        yield
    except (OSError, pa.ArrowException) as e:
        raise OSError(f"{damaged} {url(fs, path)}: {e}") from e


@dataclass(frozen=True)
class RecordReader:
    """A JSON Lines or CSV file's records in batches of ``schema`` (the declared columns, then the corrupt one)."""

    fs: Any = field(repr=False)
    format: str
    schema: pa.Schema
    options: dict[str, str]
    sizes: dict[str, int] = field(default_factory=dict)
    """path → the bytes a read must get (the size cut into the barrier); unchecked when absent."""

    def __call__(self, path: str) -> Iterator[pa.RecordBatch]:
        import io

        import pyarrow as pa
        from fsspec.compression import compr
        from fsspec.utils import infer_compression

        from airflow_provider_checkpoint.fileio.records import PartlyMalformed, records

        declared = pa.schema(list(self.schema)[:-1])
        empty = [None] * len(declared)
        rows: list[list[Any]] = []
        expected = self.sizes.get(path)
        # a byte more than the barrier's: a file that grew or was replaced since is read past it, and refused
        with open_sized(self.fs, path, None if expected is None else expected + 1) as raw:
            compression = infer_compression(path)
            stream = compr[compression](raw, mode="rb") if compression else raw
            text = io.TextIOWrapper(stream, encoding="utf-8", errors="replace")
            for values, line in records(text, self.format, declared, self.options):
                malformed = values is None or isinstance(values, PartlyMalformed)
                rows.append([*(values if values is not None else empty), line if malformed else None])
                if len(rows) == BATCH_ROWS:
                    yield _batch(rows, self.schema)
                    rows = []
            if expected is not None and raw.tell() != expected:
                raise OSError(
                    f"read {raw.tell()} of the {expected} bytes of {url(self.fs, path)} cut into the barrier: "
                    "the store answered short or the file changed; the step fails and nothing of it is committed"
                )
        if rows:
            yield _batch(rows, self.schema)


def _batch(rows: list[list[Any]], schema: pa.Schema) -> pa.RecordBatch:
    import pyarrow as pa

    columns = [pa.array([r[i] for r in rows], type=f.type) for i, f in enumerate(schema)]
    return pa.RecordBatch.from_arrays(columns, schema=schema)
