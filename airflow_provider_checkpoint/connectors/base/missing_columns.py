"""An input lacking a column its table has, with ``schema_evolution="additive"`` (Parquet and Delta sinks), is
written as Delta Lake writes it: an append, or a ``MERGE … INSERT *`` of a new key, has the column null; a
``MERGE … UPDATE SET *`` with schema evolution keeps the value the key's row holds in it (delta-io docs,
"Automatic schema evolution": "updated with the new_value in the source leaving old_value unchanged"). E.g.
a pipeline redeployed without the column after a restore to a checkpoint before it.

Refused (:class:`SinkSchemaError` naming the table and the column), nothing staged: a column the table
declares not nullable (Delta refuses such a write too).

An upsert reads the footers of the table's files first (:func:`upsert_rows`): while none may hold a value in
the missing columns (a restore to before they were added, a table they were just added to), the input is
filled with nulls and nothing else is read; else the keys and those columns of the rows holding a value are
read into the driver and joined to the input by key.

The filled input has the table's columns in the table's order, then the columns it adds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple

from airflow_provider_checkpoint.connectors.base.file_threads import each_file
from airflow_provider_checkpoint.exceptions import SinkSchemaError
from airflow_provider_checkpoint.fileio.arrow_numpy import arrow_of, numpy_of
from airflow_provider_checkpoint.storage.object_store import open_sized

if TYPE_CHECKING:
    from collections.abc import Iterable

    import fsspec
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructField, StructType

    from airflow_provider_checkpoint.connectors.base.upsert_rule import UpsertRows

FOOTER_READ = 64 << 10
"""The bytes read from a file's end for its footer: one ranged GET on an object store when the footer fits."""

log = logging.getLogger(__name__)


def footer(fs: fsspec.AbstractFileSystem, path: str, size: int) -> pq.FileMetaData:
    """The footer of the Parquet file ``path`` of ``size`` bytes: its last :data:`FOOTER_READ` bytes in one
    read, the whole footer read as pyarrow reads it when it is longer."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tail = fs.cat_file(path, start=max(0, size - FOOTER_READ), end=size)
    length = int.from_bytes(tail[-8:-4], "little") + 8 if len(tail) >= 8 else size
    if length > len(tail):
        with open_sized(fs, path, size) as f:
            return pq.read_metadata(f)
    return pq.read_metadata(pa.BufferReader(tail))


def missing_fields(table: str, stored: StructType, given: Iterable[str]) -> list[StructField]:
    """The columns of the table (``stored``) that the input's columns ``given`` lack; refused if one of them is
    not nullable."""
    names = set(given)
    missing = [f for f in stored.fields if f.name not in names]
    required = [f.name for f in missing if not f.nullable]
    if required:
        raise SinkSchemaError(
            f"{table}: the input lacks column(s) {required}, which the table declares NOT NULL "
            "(schema_evolution='additive' fills only a nullable column with null): give them in the input"
        )
    return missing


class Missing(NamedTuple):
    """The table's columns an input lacks (``fields``, written null) and the table's columns in order."""

    order: Sequence[str]
    fields: list[StructField]

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.fields]

    def frame(self, df: DataFrame) -> DataFrame:
        """:func:`filled_frame`."""
        return filled_frame(df, self.order, self.fields)

    def upsert_rows(self, rows: UpsertRows) -> UpsertRows:
        """:func:`filled_upsert_rows`."""
        return filled_upsert_rows(rows, self.order, self.fields)


NONE_MISSING = Missing((), [])


def _order(columns: Sequence[str], stored: Sequence[str], missing: Sequence[str]) -> list[str]:
    have = set(columns) | set(missing)
    return [c for c in stored if c in have] + [c for c in columns if c not in set(stored)]


def filled_schema(given: StructType, stored: Sequence[str], missing: list[StructField]) -> StructType:
    """The input's columns ``given`` with the ``missing`` ones, in the table's order (``stored``) first."""
    from pyspark.sql.types import StructType

    fields = {f.name: f for f in [*given.fields, *missing]}
    return StructType([fields[c] for c in _order(given.fieldNames(), stored, [f.name for f in missing])])


def filled_frame(df: DataFrame, stored: Sequence[str], missing: list[StructField]) -> DataFrame:
    """``df`` with each ``missing`` column null, the table's columns (``stored``) in its order first."""
    from pyspark.sql import functions as F

    if not missing:
        return df
    nulls = {f.name: F.lit(None).cast(f.dataType).alias(f.name) for f in missing}
    order = _order(df.columns, stored, list(nulls))
    return df.select(*[nulls[c] if c in nulls else F.col(f"`{c.replace('`', '``')}`") for c in order])


def filled_arrow(rows: pa.Table, stored: Sequence[str], missing: list[StructField]) -> pa.Table:
    """``rows`` (as Spark's ``toArrow`` gives them) with each ``missing`` column null, in the order of
    :func:`filled_frame`."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    arrow = to_arrow_schema(StructType(missing), timezone="UTC")
    columns = {**{n: rows[n] for n in rows.column_names}, **{f.name: pa.nulls(len(rows), f.type) for f in arrow}}
    fields = {**{f.name: f for f in rows.schema}, **{f.name: f for f in arrow}}
    order = _order(rows.column_names, stored, arrow.names)
    return pa.Table.from_arrays([columns[c] for c in order], schema=pa.schema([fields[c] for c in order]))


def filled_upsert_rows(rows: UpsertRows, stored: Sequence[str], missing: list[StructField]) -> UpsertRows:
    """An upsert's input with each ``missing`` column null: the DataFrame, or the rows read on the driver (their
    DataFrame made only if Spark needs it); rows the driver held of the input are not used (they lack it)."""
    from airflow_provider_checkpoint.dataflow.driver_rows import SourceRows

    if not missing:
        return rows
    read = rows.read
    if read is None:
        return replace(rows, df=filled_frame(rows.data(), stored, missing), in_driver=None)
    schema = filled_schema(read.schema, stored, missing)
    filled = SourceRows(
        filled_arrow(read.rows, stored, missing), schema, lambda: filled_frame(read.frame(), stored, missing)
    )
    return replace(rows, read=filled, in_driver=None)


class TableFile(NamedTuple):
    """A data file of an upsert table: ``path``, ``size``, and the positions of its rows deleted (a Delta
    deletion vector, read only if the file is read)."""

    path: str
    size: int
    deleted: Callable[[], np.ndarray] | None = None


def upsert_rows(
    table: str, fs: fsspec.AbstractFileSystem, files: Sequence[TableFile], rows: UpsertRows, missing: Missing
) -> UpsertRows:
    """An upsert's input lacking the ``missing`` columns of the ``table`` (its data ``files``), as Delta's
    ``MERGE … UPDATE SET * INSERT *`` with schema evolution writes it: a key the table holds keeps its row's
    values in them, a new key has them null. The files' footers tell which may hold a value (:func:`may_hold_values`,
    read at once); only those are read (the keys and those columns), keeping the live rows with a value, in
    the driver; none: the input is only filled with nulls (:func:`filled_upsert_rows`)."""
    import pyarrow as pa

    if not missing.fields:
        return rows
    columns = missing.names
    valued = each_file(lambda f: may_hold_values(fs, f, columns), list(files))
    reading = [f for f, v in zip(files, valued, strict=True) if v]
    keys = list(rows.keys)
    held = [t for t in each_file(lambda f: held_values(fs, f, keys, columns), reading) if t.num_rows]
    log.info("%s: input lacks %s; %d of %d files may hold values, %d rows kept", table, columns, len(reading),
             len(files), sum(t.num_rows for t in held))  # fmt: skip
    if not held:
        return missing.upsert_rows(rows)
    return _kept(rows, missing, pa.concat_tables(held, promote_options="permissive"))


def _kept(rows: UpsertRows, missing: Missing, held: pa.Table) -> UpsertRows:
    """``rows`` (one per key: :meth:`UpsertRows.frame`) with the ``missing`` columns of the ``held`` row of
    their key (a left join, null for a key not held) as a DataFrame, which keeps the source order no more."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructField, StructType

    from airflow_provider_checkpoint.fileio.frames import arrow_frame

    keys = list(rows.keys)
    check_held_once(rows.uid, keys, held)
    df = rows.frame()
    renamed = [f"__held_key_{i}" for i in range(len(keys))]
    types = {f.name: f.dataType for f in df.schema.fields}
    schema = StructType([*[StructField(r, types[k]) for k, r in zip(keys, renamed, strict=True)], *missing.fields])
    old = arrow_frame(df.sparkSession, held.rename_columns([*renamed, *held.column_names[len(keys) :]]), schema)
    on = [df[f"`{k}`"].eqNullSafe(old[r]) for k, r in zip(keys, renamed, strict=True)]
    joined = df.join(F.broadcast(old), on, "left")
    order = _order(df.columns, missing.order, missing.names)
    out = joined.select(*[old[f"`{c}`"] if c in missing.names else df[f"`{c}`"] for c in order])
    return replace(rows, df=out, read=None, in_driver=None, reduce=False, count=None)


def check_held_once(uid: str, keys: Sequence[str], held: pa.Table) -> None:
    """Refuse (:class:`SinkSchemaError`) the live rows ``held`` of a table when they hold a key twice (null-safe),
    by the upsert rule's own check (:func:`~.upsert_rule.latest_in_arrow`: one integer key by a sort)."""
    from airflow_provider_checkpoint.connectors.base.upsert_rule import latest_in_arrow

    if latest_in_arrow(held.select(list(keys)), keys, ()).num_rows != held.num_rows:
        raise SinkSchemaError(f"sink {uid}: the table holds a key {list(keys)} twice; nothing staged")


def may_hold_values(fs: fsspec.AbstractFileSystem, file: TableFile, columns: Sequence[str]) -> bool:
    """Whether a row of ``file`` may hold a value in one of ``columns``, by its footer: a column is null in a
    file that lacks it or whose every row group counts all its rows null; a column without statistics, or
    nested (a leaf's null count does not tell an empty list from a null), may hold values."""
    meta = footer(fs, file.path, file.size)
    leaf = 0
    for field in meta.schema.to_arrow_schema():  # Parquet's leaf columns follow the top-level ones in order
        leaves = _leaves(field.type)
        if field.name in columns:
            if leaves != 1 or field.type.num_fields > 0:
                return True
            stats = [(g.num_rows, g.column(leaf).statistics) for g in map(meta.row_group, range(meta.num_row_groups))]
            if any(s is None or not s.has_null_count or s.null_count != n for n, s in stats):
                return True
        leaf += leaves
    return False


def held_values(fs: fsspec.AbstractFileSystem, file: TableFile, keys: list[str], columns: Sequence[str]) -> pa.Table:
    """The keys and ``columns`` of the live rows of ``file`` holding a value in one of ``columns`` (a column
    the file lacks: null), read batch by batch."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    deleted = file.deleted() if file.deleted is not None else np.zeros(0, dtype=np.uint64)
    found, at = [], 0
    with open_sized(fs, file.path, file.size) as source:
        reader = pq.ParquetFile(source, coerce_int96_timestamp_unit="us")
        present = [c for c in columns if c in reader.schema_arrow.names]
        for batch in reader.iter_batches(columns=[*keys, *present]):
            live = ~np.isin(np.arange(at, at + batch.num_rows, dtype=np.uint64), deleted)
            at += batch.num_rows
            valued = np.zeros(batch.num_rows, dtype=bool)
            for c in present:
                valued |= numpy_of(pc.is_valid(batch.column(c)))
            kept = pa.Table.from_batches([batch]).filter(arrow_of(live & valued))
            for c in columns:
                if c not in present:
                    kept = kept.append_column(c, pa.nulls(kept.num_rows))
            found.append(kept.select([*keys, *columns]))
    return pa.concat_tables(found) if found else pa.table({c: pa.nulls(0) for c in [*keys, *columns]})


def _leaves(t: pa.DataType) -> int:
    """How many Parquet leaf columns a column of Arrow type ``t`` is stored as."""
    return sum(_leaves(t.field(i).type) for i in range(t.num_fields)) if t.num_fields else 1
