"""Upsert of one table bucket with pyarrow alone: the old file streamed, the changed rows in memory.

The upsert sink merges small changes this way in the driver instead of shuffling the
table through Spark: per bucket, the old file is read batch by batch, every row whose key
changed is dropped, and the changed rows are appended — memory is the changed rows plus
one batch, whatever the bucket's size. Keys compare null-safely (a null key is a key like
any other), as in the state merge.

The written file has the changed rows' Arrow schema (from Spark's ``toArrow``) with every
column nullable, as Spark writes Parquet; old rows are cast to it. Files whose columns
differ in more than representation (string vs large string, timestamp unit or zone —
Spark's INT96 timestamps are UTC instants) are not merged here: :func:`mergeable` says so
first and the sink falls back to Spark.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import fsspec
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

BATCH_ROWS = 65_536


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


def mergeable(fs: fsspec.AbstractFileSystem, old_files: Sequence[str], changed: pa.Schema, keys: Sequence[str]) -> bool:
    """Whether every file in ``old_files`` can be merged with rows of schema ``changed`` here."""
    import pyarrow.parquet as pq

    if not all(_key_type_supported(changed.field(k).type) for k in keys):
        return False
    want = {f.name: _family(f.type) for f in changed}
    for path in old_files:
        with fs.open(path, "rb") as f:
            have = pq.read_schema(f)
        if {f.name: _family(f.type) for f in have} != want:
            return False
    return True


@contextmanager
def table_writer(fs: fsspec.AbstractFileSystem, out: str, schema: pa.Schema) -> Iterator[pq.ParquetWriter]:
    """A Parquet writer of ``out`` as the sinks write table files on the driver (zstd), closed on exit."""
    import pyarrow.parquet as pq

    with fs.open(out, "wb") as sink, pq.ParquetWriter(sink, schema, compression="zstd") as writer:
        yield writer


def merge_bucket(
    fs: fsspec.AbstractFileSystem, old: str | None, changed: pa.Table, keys: Sequence[str], out: str
) -> int:
    """Write ``out``: the rows of ``old`` whose key is not in ``changed``, then ``changed``; the row count.

    ``changed`` holds each key at most once (the upsert's input); ``old`` each key at most once.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = target_schema(changed.schema)
    changed = changed.select(schema.names).cast(schema)
    rows = 0
    with table_writer(fs, out, schema) as writer:
        if old is not None:
            drop = KeySet(changed, keys)
            with fs.open(old, "rb") as source:
                reader = pq.ParquetFile(source, coerce_int96_timestamp_unit="us")
                for batch in reader.iter_batches(batch_size=BATCH_ROWS, columns=schema.names):
                    kept = drop.kept(pa.Table.from_batches([batch]).select(schema.names).cast(schema))
                    if kept.num_rows:
                        writer.write_table(kept)
                        rows += kept.num_rows
        if changed.num_rows:
            writer.write_table(changed)
            rows += changed.num_rows
    return rows


class KeySet:
    """The keys of the changed rows, to drop their old rows from batches (null-safe)."""

    def __init__(self, changed: pa.Table, keys: Sequence[str]) -> None:
        import pyarrow.compute as pc

        self.keys = list(keys)
        self.table = changed.select(self.keys)
        nulls = _any_null(self.table)
        self.with_nulls = {tuple(r.values()) for r in self.table.filter(nulls).to_pylist()}
        self.without_nulls = self.table.filter(pc.invert(nulls))

    def kept(self, table: pa.Table) -> pa.Table:
        """The rows of ``table`` whose key did not change."""
        import numpy as np
        import pyarrow as pa

        if not self.table.num_rows:
            return table
        return table.filter(pa.array(np.logical_not(self.changed(table))))

    def changed(self, table: pa.Table) -> np.ndarray:
        """Per row of ``table`` (which holds at least the key columns): whether its key changed."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        if not self.table.num_rows:
            return np.zeros(table.num_rows, dtype=bool)
        if len(self.keys) == 1:  # is_in without skipping nulls is null-safe already
            (key,) = self.keys
            mask = pc.is_in(table[key], value_set=self.table[key], skip_nulls=False)
            return np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool)
        keys = table.select(self.keys).append_column("__row", pa.array(np.arange(table.num_rows)))
        nulls = _any_null(keys)
        out = np.zeros(table.num_rows, dtype=bool)
        plain = keys.filter(pc.invert(nulls)).join(self.without_nulls, self.keys, join_type="left semi")
        out[plain["__row"].to_numpy()] = True
        if self.with_nulls:
            partial = keys.filter(nulls).to_pylist()
            out[[r["__row"] for r in partial if tuple(r[k] for k in self.keys) in self.with_nulls]] = True
        return out


def _any_null(table: pa.Table) -> pa.ChunkedArray:
    import pyarrow.compute as pc

    mask = pc.is_null(table.column(0))
    for column in table.columns[1:]:
        mask = pc.or_(mask, pc.is_null(column))
    return mask
