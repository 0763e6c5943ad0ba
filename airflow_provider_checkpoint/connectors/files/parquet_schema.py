"""The columns of a Parquet table: the input's checked against them, and added or missing ones
(``ParquetTableSink(schema_evolution="additive")``).

A column of the input that the table lacks is written, nullable, by the files of the checkpoint that brings
it, and that checkpoint rewrites every committed file lacking it with it appended, null (:func:`filled_files`):
in ``upsert`` mode the bucket files (:func:`filled_buckets`), the changed rows merged into those copies; in
``append`` mode every earlier file. After its commit every file has the table's whole schema again, so no
merge reads files of two schemas and a reader taking one file's schema (pyarrow ``dataset``, DuckDB, Spark
without ``mergeSchema``) reads the column, null in the older rows: DuckDB refuses a directory whose later
files lack a column of the first, and the others would drop a column the first file lacks. An input lacking
a nullable column of the table is written with it null, in upsert mode only while no row of the table holds
a value in it (:mod:`~airflow_provider_checkpoint.connectors.base.missing_columns`). Without ``"additive"``
every step refuses an input whose columns differ from the table's (:func:`check_columns`).
No type changes: Spark's ``mergeSchema`` refuses files that disagree on a column's type (``int`` and
``bigint`` among them), so a retyped column, widening included, is refused before anything is staged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_checkpoint.connectors.base.bucket_merge import open_parquet
from airflow_provider_checkpoint.connectors.base.bucketed import StagedBucket, bucket_file
from airflow_provider_checkpoint.connectors.base.file_threads import each_file
from airflow_provider_checkpoint.connectors.base.missing_columns import NONE_MISSING, Missing, footer, missing_fields
from airflow_provider_checkpoint.connectors.base.sink import check_input_columns
from airflow_provider_checkpoint.connectors.base.table_files import Listing, list_names
from airflow_provider_checkpoint.exceptions import SinkSchemaError
from airflow_provider_checkpoint.storage.object_store import is_s3

if TYPE_CHECKING:
    import fsspec
    import pyarrow as pa
    from pyspark.sql.types import StructType

    from airflow_provider_checkpoint.storage.job_storage import Location


_NO_RETYPE = (
    "; a retyped column is refused, widening too (Spark's mergeSchema reads no table whose files disagree on a "
    "column's type): write to a new table path"
)


def footer_schema(fs: fsspec.AbstractFileSystem, path: str, size: int) -> pa.Schema:
    """The schema in the footer of the Parquet file ``path`` of ``size`` bytes (:func:`.missing_columns.footer`:
    one ranged read when it fits)."""
    return footer(fs, path, size).schema.to_arrow_schema()


def table_schema(table: Location, listed: Listing | None = None) -> pa.Schema | None:
    """The schema in the footer of the newest (last by name) committed Parquet file of the ``table`` (of
    ``listed``, its files with their sizes, else of one listing); ``None`` for a table without files."""
    if listed is None:
        if not table.exists(""):
            return None
        listed = list_names(table.fs, table.base, "part-")
    committed = sorted(p for p in listed if p.endswith(".parquet"))
    if not committed:
        return None
    newest = table.path(table.relative(committed[-1]))
    return footer_schema(table.fs, newest, listed[committed[-1]])


def check_columns(table: str, footer: pa.Schema, given: StructType, left_out: str | None, additive: bool) -> Missing:
    """Refuse (:class:`SinkSchemaError` naming the ``table``, the column and both types) input columns ``given``
    that differ from the table's (``footer``: its newest file's schema) by name or type, nullability aside, but
    ``left_out`` (a column not written); ``additive``: an added column passes, and a missing nullable one
    (:func:`.missing_columns.missing_fields`), returned: the input is written with it null. A retyped column
    never passes. Nothing is compared for a footer of a type Spark does not read."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from airflow_provider_checkpoint.fileio.scans import as_nullable

    try:
        declared = from_arrow_schema(footer, prefer_timestamp_ntz=False)  # timestamps: UTC instants
    except (TypeError, ValueError, NotImplementedError):
        return NONE_MISSING
    stored = as_nullable(declared)
    types = {f.name: f.dataType.simpleString() for f in stored.fields}
    written = {f.name: f.dataType.simpleString() for f in as_nullable(given).fields if f.name != left_out}
    missing = missing_fields(table, declared, given.fieldNames()) if additive else []
    if additive:
        written = {name: kind for name, kind in written.items() if name in types}
        written.update({f.name: types[f.name] for f in missing})
    evolve = "schema_evolution='additive' writes them from this checkpoint on; else drop them before the sink"
    try:
        check_input_columns(table, types, written, evolve)
    except SinkSchemaError as e:
        if any(types[c] != written[c] for c in set(types) & set(written)):
            raise SinkSchemaError(f"{e}{_NO_RETYPE}") from None
        raise
    return Missing(footer.names, missing)


def added_fields(table: pa.Schema, given: StructType, left_out: str | None) -> pa.Schema:
    """The columns of the input ``given`` that ``table`` lacks (but ``left_out``, a column not written), as
    Arrow fields the way the sink's Parquet writers store them (timestamps in UTC), nullable."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    new = StructType([f for f in given.fields if f.name not in table.names and f.name != left_out])
    return pa.schema([f.with_nullable(True) for f in to_arrow_schema(new, timezone="UTC")])


def filled_buckets(
    fs: fsspec.AbstractFileSystem, directory: str, added: pa.Schema, committed: dict[int, tuple[str, int]]
) -> list[StagedBucket]:
    """Each ``committed`` bucket file (bucket → path, size) lacking a column of ``added``, rewritten into
    ``directory`` (:func:`filled_files`)."""
    filled = filled_files(fs, directory, added, {bucket_file(b): file for b, file in committed.items()})
    return [StagedBucket(b, *filled[bucket_file(b)]) for b in sorted(committed) if bucket_file(b) in filled]


def filled_files(
    fs: fsspec.AbstractFileSystem, directory: str, added: pa.Schema, committed: dict[str, tuple[str, int]]
) -> dict[str, tuple[str, int, int]]:
    """Each ``committed`` file (name → path, size) lacking a column of ``added``, rewritten into ``directory``
    under its name with its rows unchanged and the columns it lacks appended, null (batch by batch), up to
    :data:`~.file_threads.FILE_THREADS` files at once (an object store's round trips overlap): name →
    (path, rows, size) of the copy. A file Spark wrote with INT96 timestamps is rewritten with INT96 ones, so
    every reader types its columns as before and as Spark's other files of the table."""
    if not is_s3(fs):  # object stores have no directories to make
        fs.makedirs(directory, exist_ok=True)
    files = sorted(committed.items())
    filled = each_file(lambda file: _filled_file(fs, directory, added, *file), files)
    return {name: copy for (name, _), copy in zip(files, filled, strict=True) if copy is not None}


def _filled_file(
    fs: fsspec.AbstractFileSystem, directory: str, added: pa.Schema, name: str, file: tuple[str, int]
) -> tuple[str, int, int] | None:
    """:func:`filled_files` of one file: ``None`` if it lacks no column of ``added``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path, size = file
    with open_parquet(fs, path, size) as reader:
        old = reader.schema_arrow
        lacking = [f for f in added if f.name not in old.names]
        if not lacking:
            return None
        grown = pa.schema([*old, *lacking], metadata=grown_metadata(old.metadata, lacking))
        int96 = any(c.physical_type == "INT96" for c in reader.schema)
        out, rows = f"{directory}/{name}", 0
        with fs.open(out, "wb") as sink:
            with pq.ParquetWriter(sink, grown, compression="zstd", use_deprecated_int96_timestamps=int96) as writer:
                for batch in reader.iter_batches():
                    nulls = [pa.nulls(batch.num_rows, f.type) for f in lacking]
                    writer.write_batch(pa.RecordBatch.from_arrays([*batch.columns, *nulls], schema=grown))
                    rows += batch.num_rows
            size = sink.tell()
    return out, rows, size


SPARK_SCHEMA = b"org.apache.spark.sql.parquet.row.metadata"
"""The footer key under which a file Spark wrote keeps its Spark schema: Spark reads the file's columns from it."""


def grown_metadata(metadata: dict[bytes, bytes] | None, lacking: list[pa.Field]) -> dict[bytes, bytes] | None:
    """The footer ``metadata`` of a file given the columns ``lacking``: the Spark schema it holds, if any, with
    them appended, nullable (else Spark, reading that file's footer for the table's columns, misses them)."""
    import json

    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_schema

    from airflow_provider_checkpoint.fileio.scans import as_nullable

    if not metadata or SPARK_SCHEMA not in metadata:
        return metadata
    schema = json.loads(metadata[SPARK_SCHEMA])
    added = as_nullable(from_arrow_schema(pa.schema(lacking), prefer_timestamp_ntz=False))
    schema["fields"] = [*schema["fields"], *added.jsonValue()["fields"]]
    return {**metadata, SPARK_SCHEMA: json.dumps(schema).encode()}
