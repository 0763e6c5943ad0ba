"""Upsert of one table bucket with pyarrow alone: the old file streamed, the changed rows in memory.

The upsert sink merges small changes this way in the driver instead of shuffling the
table through Spark: per bucket, the old file is read batch by batch, every row whose key
changed is dropped, and the changed rows are appended — memory is the changed rows plus
one batch, and the old file's bytes if it has at most :data:`WHOLE_FILE_BYTES` (read in one
request, :func:`open_parquet`). Keys compare null-safely (a null key is a key like any other),
as in the state merge.

The written file has the changed rows' Arrow schema (from Spark's ``toArrow``) with every
column nullable, as Spark writes Parquet; old rows are cast to it. Keys of a type compared
here (:func:`keys_mergeable`) and files whose columns differ in no more than representation
(string vs large string, timestamp unit or zone — Spark's INT96 timestamps are UTC instants;
:func:`mergeable`) are merged here; otherwise the sink falls back to Spark.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.fileio.arrow_numpy import arrow_of, numpy_of
from airflow_provider_checkpoint.storage.object_store import read_object

if TYPE_CHECKING:
    import fsspec
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

BATCH_ROWS = 65_536
WHOLE_FILE_BYTES = 32 * 1024**2
"""An old bucket file up to this size is read in one request (:func:`open_parquet`)."""
DICTIONARY_PAGE_BYTES = 64 << 10
"""A column chunk's dictionary grows to at most this size, then the chunk goes on plain-encoded (Parquet's
fallback, as parquet-mr writes it at 1 MiB): a column of few distinct values keeps its dictionary, one of
mostly distinct values (ids, labels, measures) stops building one early. Measured on 80,000 CDC rows
(eight columns, zstd): 1 MiB 0.19-0.49 s and 1.77 MB, 64 KiB 0.11-0.12 s and 1.11 MB."""


def _family(t: pa.DataType) -> object:
    """What must match between an old file's column and the changed rows' for a cast to be lossless."""
    import pyarrow as pa

    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return "binary"
    if pa.types.is_timestamp(t):
        return "timestamp"
    return t


def _key_type_supported(t: pa.DataType) -> bool:
    import pyarrow as pa

    return _family(t) in ("string", "binary", "timestamp") or any(
        check(t)
        for check in (
            pa.types.is_integer,
            pa.types.is_floating,
            pa.types.is_boolean,
            pa.types.is_date,
            pa.types.is_decimal,
        )
    )


def target_schema(changed: pa.Schema) -> pa.Schema:
    """The schema a merged bucket file is written with: ``changed``'s, every column nullable."""
    import pyarrow as pa

    return pa.schema([f.with_nullable(True) for f in changed])


def keys_mergeable(changed: pa.Schema, keys: Sequence[str]) -> bool:
    """Whether the keys of rows of schema ``changed`` compare here (not nested types)."""
    return all(_key_type_supported(changed.field(k).type) for k in keys)


def mergeable(old: pa.Schema, changed: pa.Schema) -> bool:
    """Whether a file of schema ``old`` merges here with rows of schema ``changed``."""
    return {f.name: _family(f.type) for f in old} == {f.name: _family(f.type) for f in changed}


@contextmanager
def open_parquet(fs: fsspec.AbstractFileSystem, path: str, size: int) -> Iterator[pq.ParquetFile]:
    """The Parquet file ``path`` of ``size`` bytes (its size as listed): read whole in one request (no
    HEAD first) if it has at most :data:`WHOLE_FILE_BYTES`, else streamed as its batches are read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if size <= WHOLE_FILE_BYTES:
        yield pq.ParquetFile(pa.BufferReader(read_object(fs, path)), coerce_int96_timestamp_unit="us")
        return
    with fs.open(path, "rb") as source:
        yield pq.ParquetFile(source, coerce_int96_timestamp_unit="us")


@contextmanager
def table_writer(
    fs: fsspec.AbstractFileSystem, out: str, schema: pa.Schema, written: list[int] | None = None
) -> Iterator[pq.ParquetWriter]:
    """A Parquet writer of ``out`` as the sinks write table files on the driver (zstd, dictionaries up to
    :data:`DICTIONARY_PAGE_BYTES`), closed on exit; ``written``: the size of the complete file is appended to it."""
    import pyarrow.parquet as pq

    with fs.open(out, "wb") as sink:
        with pq.ParquetWriter(
            sink, schema, compression="zstd", dictionary_pagesize_limit=DICTIONARY_PAGE_BYTES
        ) as writer:
            yield writer
        if written is not None:
            written.append(sink.tell())


def kept_rows(changed: pa.Table, delete_when: str | None) -> pa.Table:
    """``changed`` without its rows whose boolean ``delete_when`` column is true (they delete their key),
    and without that column."""
    import pyarrow.compute as pc

    if delete_when is None:
        return changed
    flag = changed[delete_when]  # kept: false or null (no Python scalar: pyarrow would import pandas for it)
    return changed.filter(pc.or_kleene(pc.invert(flag), pc.is_null(flag))).drop_columns([delete_when])


def merge_bucket(
    fs: fsspec.AbstractFileSystem,
    old: pq.ParquetFile | None,
    changed: pa.Table,
    keys: Sequence[str],
    out: str,
    delete_when: str | None = None,
) -> tuple[int, int]:
    """Write ``out``: the rows of ``old`` whose key is not in ``changed``, then ``changed`` but its rows whose
    boolean ``delete_when`` column is true (they delete their key), without that column; ``(rows, bytes)``.

    ``changed`` holds each key at most once (the upsert's input); ``old`` each key at most once.
    """
    import pyarrow as pa

    every, changed = changed, kept_rows(changed, delete_when)
    schema = target_schema(changed.schema)
    changed = changed.select(schema.names).cast(schema)
    rows, size = 0, list[int]()
    with table_writer(fs, out, schema, size) as writer:
        if old is not None:
            drop = KeySet(every, keys)
            for batch in old.iter_batches(batch_size=BATCH_ROWS, columns=schema.names):
                kept = drop.kept(pa.Table.from_batches([batch]).select(schema.names).cast(schema))
                if kept.num_rows:
                    writer.write_table(kept)
                    rows += kept.num_rows
        if changed.num_rows:
            writer.write_table(changed)
            rows += changed.num_rows
    return rows, size[0]


class KeySet:
    """The keys of the changed rows, to drop their old rows from batches (null-safe)."""

    def __init__(self, changed: pa.Table, keys: Sequence[str]) -> None:
        import pyarrow.compute as pc

        self.keys = list(keys)
        self.table = changed.select(self.keys)
        nulls = _any_null(self.table)
        self.with_nulls = {tuple(r.values()) for r in self.table.filter(nulls).to_pylist()}
        self.without_nulls = self.table.filter(pc.invert(nulls))
        index = int_keys(self.table, self.keys)
        self.index = index if index is not None and not index.nulls else None
        """A single integer key without nulls: its values indexed (:class:`IntKeys`: looked up in a bitmap over
        their span, or by binary search)."""

    def kept(self, table: pa.Table) -> pa.Table:
        """The rows of ``table`` whose key did not change."""
        import numpy as np

        if not self.table.num_rows:
            return table
        return table.filter(arrow_of(np.logical_not(self.changed(table))))

    def changed(self, table: pa.Table) -> np.ndarray:
        """Per row of ``table`` (which holds at least the key columns): whether its key changed."""
        import numpy as np
        import pyarrow.compute as pc

        if not self.table.num_rows:
            return np.zeros(table.num_rows, dtype=bool)
        if len(self.keys) == 1:  # is_in without skipping nulls is null-safe already
            (key,) = self.keys
            column = table[key]
            if self.index is not None and column.null_count == 0 and column.type == self.table[key].type:
                return self.index.holds(numpy_of(column))
            mask = pc.is_in(table[key], value_set=self.table[key], skip_nulls=False)
            return np.asarray(numpy_of(mask), dtype=bool)
        keys = table.select(self.keys).append_column("__row", arrow_of(np.arange(table.num_rows)))
        nulls = _any_null(keys)
        out = np.zeros(table.num_rows, dtype=bool)
        plain = keys.filter(pc.invert(nulls)).join(self.without_nulls, self.keys, join_type="left semi")
        out[numpy_of(plain["__row"])] = True
        if self.with_nulls:
            partial = keys.filter(nulls).to_pylist()
            out[[r["__row"] for r in partial if tuple(r[k] for k in self.keys) in self.with_nulls]] = True
        return out


DENSE_KEY_SPAN = 1 << 24
"""The widest span of integer keys indexed by a bitmap of that many bytes (else sorted, looked up by binary search)."""


@dataclass(frozen=True)
class IntKeys:
    """One integer key column's non-null values, indexed for lookups: a bitmap over their span (``bitmap[v -
    lowest]`` tells whether ``v`` is one; one ``False`` after the span, which every value outside it looks up) when
    the span is at most :data:`DENSE_KEY_SPAN`, made without a sort; else the values sorted."""

    nulls: int
    repeats: bool
    """Whether a non-null value is there twice."""
    lowest: int
    bitmap: np.ndarray | None
    ordered: np.ndarray | None

    def holds(self, values: np.ndarray) -> np.ndarray:
        """Per value of ``values`` (integers of the keys' type): whether it is one of the keys."""
        import numpy as np

        if self.bitmap is not None:
            return self.bitmap[np.minimum(_offsets(values, self.lowest), np.uint64(len(self.bitmap) - 1))]
        assert self.ordered is not None  # one of the two
        if not len(self.ordered):
            return np.zeros(len(values), dtype=bool)
        at = np.minimum(np.searchsorted(self.ordered, values), len(self.ordered) - 1)
        return np.asarray(self.ordered[at] == values, dtype=bool)


_INDEXED: list[tuple[pa.ChunkedArray, IntKeys]] = []
"""The last key column :func:`int_keys` indexed, held (so its memory is not reused), with its index."""


def int_keys(table: pa.Table, keys: Sequence[str]) -> IntKeys | None:
    """``table``'s one integer key column indexed (:class:`IntKeys`); ``None`` for other keys. The same column
    again (the same memory: the rows the upsert rule found one per key, then looked up by :class:`KeySet`) is
    not indexed again: the last column indexed is kept, and held."""
    import numpy as np
    import pyarrow as pa

    if len(keys) != 1 or not pa.types.is_integer(table.schema.field(keys[0]).type):
        return None
    column = table[keys[0]]
    where = _memory(column)
    for held, known in list(_INDEXED):
        if held.type == column.type and _memory(held) == where:
            return known
    values = numpy_of(column.drop_null())
    lowest, highest = (int(values.min()), int(values.max())) if len(values) else (0, -1)
    if len(values) and highest - lowest < DENSE_KEY_SPAN:
        bitmap = np.zeros(highest - lowest + 2, dtype=bool)
        bitmap[_offsets(values, lowest)] = True
        index = IntKeys(column.null_count, int(np.count_nonzero(bitmap)) < len(values), lowest, bitmap, None)
    else:
        ordered = np.sort(values)
        index = IntKeys(column.null_count, bool(np.any(ordered[1:] == ordered[:-1])), 0, None, ordered)
    _INDEXED[:] = [(column, index)]
    return index


def _offsets(values: np.ndarray, lowest: int) -> np.ndarray:
    """``values - lowest`` of integer ``values`` as unsigned 64-bit integers, modulo 2**64 (no overflow): a value at
    least ``lowest`` and less than ``n`` above it gives its offset, below or above that one at least ``n`` (``n``
    up to 2**63)."""
    import numpy as np

    wide = values.astype(np.uint64 if values.dtype.kind == "u" else np.int64, copy=False)
    return wide.view(np.uint64) - np.uint64(lowest % (1 << 64))


def _memory(column: pa.ChunkedArray) -> tuple[tuple[int, int, tuple[int, ...]], ...]:
    """Where ``column``'s values are: per chunk its offset, length and buffers' addresses (immutable memory: the
    same place holds the same values while a column using it is alive)."""
    return tuple(
        (c.offset, len(c), tuple(b.address if b is not None else 0 for b in c.buffers())) for c in column.chunks
    )


def _any_null(table: pa.Table) -> pa.ChunkedArray:
    import pyarrow.compute as pc

    mask = pc.is_null(table.column(0))
    for column in table.columns[1:]:
        mask = pc.or_(mask, pc.is_null(column))
    return mask
