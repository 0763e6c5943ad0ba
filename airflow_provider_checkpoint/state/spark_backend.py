"""Keyed state as Parquet, grouped by key-group range: written per checkpoint, verified on load.

A full version holds one row per key. A delta (incremental state, see
:mod:`~airflow_provider_checkpoint.state.incremental`) holds the keys that changed in one
checkpoint: their new rows, or a tombstone (``__deleted``), and that checkpoint's id
(``__seq``). Reading merges them: per key the newest row wins, a tombstone deletes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.dataflow.driver_rows import default_size, estimated_bytes
from airflow_provider_checkpoint.dataflow.keyed_join import keys_match, other_side
from airflow_provider_checkpoint.dataflow.operator import DELETED
from airflow_provider_checkpoint.exceptions import StateFileError, StateTooLargeError
from airflow_provider_checkpoint.fileio.frames import arrow_frame
from airflow_provider_checkpoint.fileio.scans import FileColumn, read_parquet
from airflow_provider_checkpoint.fileio.writes import write_parquet
from airflow_provider_checkpoint.state.files import DAMAGED, check_file, least_in_file, read_inline
from airflow_provider_checkpoint.state.handles import InlineState, OperatorSnapshot, StateHandle
from airflow_provider_checkpoint.state.incremental import merge_order, ranges_for
from airflow_provider_checkpoint.state.keygroups import range_for_index
from airflow_provider_checkpoint.storage import Location
from airflow_provider_checkpoint.storage.object_store import WHOLE_READ_BYTES, is_s3

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

SEQ = "__seq"
RANGE = "kgr"
"""The column (and directory level ``kgr=<index>``) holding a row's key-group range index as state is written."""
_FILE = "__state_file"
BROADCAST_BYTES = 64 << 20
"""Deltas up to this size are broadcast when merged with a full version (no shuffle of the full version)."""
SHIPPED_BYTES = 16 << 20
"""State files the driver read on an object store, up to this many bytes in all, travel to Spark's tasks
with the plan instead of being read again."""


def key_group(keys: tuple[str, ...], max_parallelism: int) -> Column:
    """The key group of a row: stable across Spark versions and partitionings."""
    from pyspark.sql import functions as F

    return F.pmod(F.xxhash64(*[F.col(k) for k in keys]), F.lit(max_parallelism))


def range_index(keys: tuple[str, ...], max_parallelism: int, parallelism: int) -> Column:
    """The index of the key-group range (out of ``parallelism``) a row belongs to."""
    from pyspark.sql import functions as F

    return F.floor(key_group(keys, max_parallelism) * parallelism / max_parallelism).cast("int")


def write_state(
    storage: Location,
    directory: str,
    state: DataFrame,
    keys: tuple[str, ...],
    max_parallelism: int,
    parallelism: int | None = None,
    inline_threshold: int = 0,
    max_inline: int | None = None,
    uid: str = "",
    closing: str | None = None,
) -> OperatorSnapshot:
    """Write ``state`` under ``directory`` (job-relative), one file per key-group range.

    ``parallelism`` is the number of key-group ranges (files); by default one per
    :data:`~airflow_provider_checkpoint.state.incremental.RANGE_ROWS` rows. Any later read
    may use any other parallelism. State whose Parquet form is at most ``inline_threshold``
    bytes is kept inline instead (no file). ``max_inline`` set means memory checkpoint
    storage: all state inline, and :class:`StateTooLargeError` above that size. ``closing``: as
    :func:`write_ranged`.
    """
    if not reads_only_cached(state):  # counted, then written: computed once
        state = state.persist()
    rows = state.count()
    limit = max_inline if max_inline is not None else inline_threshold
    if rows <= limit:  # a state with more rows than bytes allowed is not even collected
        parquet = _parquet_bytes(state)
        if len(parquet) <= limit:
            return OperatorSnapshot((), state.schema.json(), keys, max_parallelism, rows, InlineState.of(parquet))
        size = f"{len(parquet)} bytes"
    else:
        size = f"{rows} rows"
    if max_inline is not None:
        raise StateTooLargeError(
            f"operator {uid}: its state ({size}) exceeds max_state_size={max_inline} bytes of memory "
            "checkpoint storage (state is kept inline, at most one row per byte); raise max_state_size "
            "(at most 64 MiB) or use checkpoint_storage='filesystem'"
        )
    schema = state.schema.json()
    return write_full_version(storage, directory, state, rows, schema, keys, max_parallelism, parallelism, closing)


def reads_only_cached(df: DataFrame) -> bool:
    """Whether ``df`` reads nothing but cached data (e.g. columns of a persisted DataFrame): persisting it
    too would copy the cache. ``False`` where the plan cannot be seen (Spark Connect)."""
    jdf = getattr(df, "_jdf", None)
    if jdf is None:
        return False
    leaves = jdf.queryExecution().withCachedData().collectLeaves()
    kinds = {leaves.apply(i).getClass().getSimpleName() for i in range(leaves.size())}
    return kinds == {"InMemoryRelation"}


def write_full_version(
    storage: Location,
    directory: str,
    state: DataFrame,
    rows: int,
    schema: str,
    keys: tuple[str, ...],
    max_parallelism: int,
    parallelism: int | None = None,
    closing: str | None = None,
) -> OperatorSnapshot:
    """Write ``state`` (``rows`` rows, ``schema`` its JSON schema) as files under ``directory``,
    one per key-group range (by default one range per
    :data:`~airflow_provider_checkpoint.state.incremental.RANGE_ROWS` rows); ``closing``: as
    :func:`write_ranged`."""
    parallelism = max(1, min(max_parallelism, parallelism or ranges_for(rows, max_parallelism)))
    handles = (
        write_ranges(storage, directory, state, keys, max_parallelism, parallelism, closing=closing) if rows else []
    )
    return OperatorSnapshot(
        handles=tuple(handles),
        schema=schema,
        keys=keys,
        max_parallelism=max_parallelism,
        rows=rows,
    )


def write_ranges(
    storage: Location,
    directory: str,
    rows: DataFrame,
    keys: tuple[str, ...],
    max_parallelism: int,
    parallelism: int,
    delta: int | None = None,
    spread: bool = True,
    closing: str | None = None,
) -> list[StateHandle]:
    """Write ``rows`` under ``directory``, one file per key-group range (of ``parallelism``) that
    has rows, and return their handles (``delta``: the checkpoint id of a delta's files).

    ``spread``: one task per range (one shuffle, each row sent straight to its range's
    partition: no pass to sample range bounds); otherwise (and for one range) one task writes
    every range's file, which suits small rows such as deltas (no shuffle: the task reads the
    rows where they are, e.g. from the cache).
    """
    ranged = rows.withColumn(RANGE, range_index(keys, max_parallelism, parallelism))
    ranged = ranged.repartitionById(parallelism, RANGE) if spread and parallelism > 1 else ranged.coalesce(1)
    return write_ranged(storage, directory, ranged, max_parallelism, parallelism, delta, closing)


def write_ranged(
    storage: Location,
    directory: str,
    ranged: DataFrame,
    max_parallelism: int,
    parallelism: int,
    delta: int | None = None,
    closing: str | None = None,
) -> list[StateHandle]:
    """Write ``ranged`` (rows with their range index, of ``parallelism``, in column :data:`RANGE`) under
    ``directory``, one file per range that has rows in each task, and return their handles. ``closing``:
    an event-time operator's closing column, whose least live value in each file (read back from the file
    once, as it is written) the handle records (:attr:`StateHandle.least_end`)."""
    handles = []
    for file in write_parquet(ranged, storage.fs, storage.path(directory), partition_by=(RANGE,)):
        span = range_for_index(max_parallelism, parallelism, int(file.partition[0] or 0))
        relative = storage.relative(file.path)
        least = None if closing is None else least_in_file(storage, relative, closing)
        handles.append(StateHandle(relative, file.size, file.sha256(storage.fs), span, delta, least))
    return handles


def first_state_rows(inputs: Sequence[DataFrame], inline_threshold: int) -> int | None:
    """Spark's estimate of the rows of an operator's ``inputs`` when its first state goes to files:
    ``None`` where Spark knows no size, or when the estimate is at most ``inline_threshold`` (the state,
    at most one row per byte, may be kept inline)."""
    estimates = [estimated_rows(df) for df in inputs]
    if None in estimates:
        return None
    rows = sum(e or 0 for e in estimates)
    return rows if rows > inline_threshold else None


def estimated_rows(df: DataFrame) -> int | None:
    """Spark's estimate of ``df``'s rows: the size its plan's statistics give (for files, their bytes)
    over the default size of one of its rows, as Spark's own row estimates take it. Over Spark Connect the
    size from the server's cost explain (:func:`.estimated_bytes`) and the row's default size from the schema
    (:func:`.default_size`). ``None`` where Spark knows no size, or the row has a type whose default size is
    not known here."""
    jdf = getattr(df, "_jdf", None)
    if jdf is not None:
        size: int | None = int(str(jdf.queryExecution().optimizedPlan().stats().sizeInBytes()))
        row: int | None = int(jdf.schema().defaultSize())
    else:
        size, row = estimated_bytes(df), default_size(df.schema)
    if size is None or row is None or size >= (1 << 63) - 1:  # spark.sql.defaultSizeInBytes: unknown
        return None
    return size // (8 + row)


def _parquet_bytes(state: DataFrame) -> bytes:
    import io

    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(state.toArrow(), buffer, compression="zstd")
    return buffer.getvalue()


def read_state(
    spark: SparkSession, storage: Location, snapshot: OperatorSnapshot, verify: bool = True, uid: str = ""
) -> DataFrame:
    """The state of ``snapshot`` (of operator ``uid``): full versions merged with their deltas.

    Every file (or the inline state) is checked first: present with its size, its Parquet
    footer holding the recorded columns (else
    :class:`~airflow_provider_checkpoint.exceptions.StateFileError`), and with ``verify`` its
    SHA-256 too (a step continuing its own checkpoints skips the re-hash: each file was
    hashed when written, and Parquet page checksums are verified on read). On an object store a
    file of up to :data:`~.object_store.WHOLE_READ_BYTES` is read once for all three checks, and
    the first :data:`SHIPPED_BYTES` of such files go to Spark's tasks with the plan: each is read
    once in all.
    """
    schema = state_schema(snapshot)
    if snapshot.inline is not None:
        return arrow_frame(spark, read_inline(snapshot, uid), schema)
    loaded: dict[str, bytes] = {}
    shipped = 0
    for handle in snapshot.handles:
        if is_s3(storage.fs) and handle.size <= WHOLE_READ_BYTES:  # one GET: size, checksum and footer
            data = storage.read_verified(handle, deep=verify)
            check_file(storage, handle, snapshot, uid, data)
            if shipped + len(data) <= SHIPPED_BYTES:
                loaded[handle.path], shipped = data, shipped + len(data)
        else:
            storage.verify(handle, deep=verify)
            check_file(storage, handle, snapshot, uid)
    base, deltas = merge_order(snapshot.handles)
    keys, groups = snapshot.keys, snapshot.max_parallelism
    full = read_files(spark, storage, base, schema, keys, groups, loaded)
    if not deltas:
        return full
    changed = [h for _, hs in deltas for h in hs]
    changes = read_files(spark, storage, changed, delta_schema(schema), keys, groups, loaded)
    small = sum(h.size for h in changed) <= BROADCAST_BYTES
    return merge(full, changes, snapshot.keys, small, len(deltas))


def state_schema(snapshot: OperatorSnapshot) -> StructType:
    from pyspark.sql.types import StructType

    return StructType.fromJson(json.loads(snapshot.schema))


def delta_schema(schema: StructType) -> StructType:
    """The columns of a delta file: the state's, a tombstone flag and the checkpoint id."""
    from pyspark.sql.types import BooleanType, LongType, StructField, StructType

    reserved = {DELETED, SEQ} & set(schema.fieldNames())
    if reserved:
        raise ValueError(f"state columns {sorted(reserved)} are reserved for incremental checkpoints: rename them")
    return StructType([*schema.fields, StructField(DELETED, BooleanType()), StructField(SEQ, LongType())])


def merge(full: DataFrame, changes: DataFrame, keys: Sequence[str], small: bool = True, layers: int = 2) -> DataFrame:
    """Full-version rows overlaid with delta rows (``changes``): per key the newest delta row
    wins over older ones and over the full version; a tombstone deletes the key.

    ``layers``: how many checkpoints' deltas ``changes`` holds (one holds each key once:
    no ranking needed). ``small``: broadcast the changed keys to the full version.

    Several layers of a state whose values are all fixed-width are merged by one hash
    aggregation of the full version and the deltas (per key each value of the newest row, by
    ``__seq``): no sort of the deltas, and the result is partitioned by the keys, which a
    later aggregation or join on them reuses. Other values would make that aggregation sort
    (Spark hashes fixed-width aggregation buffers only): the deltas are ranked per key instead.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    values = [f for f in full.schema.fields if f.name not in keys]
    if layers > 1 and all(_fixed_width(f.dataType) for f in values):
        return _merged_by_hash(full, changes, keys, [f.name for f in values])
    latest = changes
    if layers > 1:
        newest = Window.partitionBy(*[F.col(k) for k in keys]).orderBy(F.col(SEQ).desc())
        latest = changes.withColumn("__rank", F.row_number().over(newest)).where("__rank = 1")
    changed = other_side(latest.select(*keys))
    kept = full.join(F.broadcast(changed) if small else changed, keys_match(keys), "left_anti")
    return kept.unionByName(latest.where(~F.col(DELETED)).select(*full.columns))


def _merged_by_hash(full: DataFrame, changes: DataFrame, keys: Sequence[str], values: list[str]) -> DataFrame:
    """:func:`merge` as one aggregation: the full version's rows rank below every delta row
    (``__seq`` -1, checkpoint ids are positive); per key each value, and the tombstone flag,
    is taken from the row of the highest ``__seq`` (null values included)."""
    from pyspark.sql import functions as F

    rows = full.select(*full.columns, F.lit(False).alias(DELETED), F.lit(-1).cast("long").alias(SEQ))
    rows = rows.unionByName(changes.select(*full.columns, DELETED, SEQ))
    newest = rows.groupBy(*keys).agg(*[F.max_by(F.col(c), F.col(SEQ)).alias(c) for c in [*values, DELETED]])
    return newest.where(~F.col(DELETED)).select(*full.columns)


def _fixed_width(data_type: DataType) -> bool:
    """Whether Spark's hash aggregation holds a value of ``data_type`` in its buffer (else it sorts)."""
    from pyspark.sql import types as T

    fixed = (
        T.BooleanType,
        T.ByteType,
        T.ShortType,
        T.IntegerType,
        T.LongType,
        T.FloatType,
        T.DoubleType,
        T.DateType,
        T.TimestampType,
        T.TimestampNTZType,
    )
    return isinstance(data_type, fixed) or (isinstance(data_type, T.DecimalType) and data_type.precision <= 18)


def read_files(
    spark: SparkSession,
    storage: Location,
    handles: Sequence[StateHandle],
    schema: StructType,
    keys: Sequence[str],
    max_parallelism: int,
    loaded: Mapping[str, bytes] | None = None,
) -> DataFrame:
    """The rows of the state files ``handles``, read with ``schema`` (``loaded``: handle path → the
    bytes of a file already read and checked, which Spark's tasks then read from memory).

    A row whose key (``keys``) falls outside the key-group range its file's handle records fails
    the Spark job that reads it with :class:`~airflow_provider_checkpoint.exceptions.StateFileError`'s
    mark, naming the file: a key in the wrong file would be kept twice or never updated.
    """
    from pyspark.sql import functions as F

    paths = [storage.path(h.path) for h in handles]
    ranged = [(path, h.key_groups) for path, h in zip(paths, handles, strict=True) if h.key_groups is not None]
    sizes = [h.size for h in handles]
    loaded = loaded or {}
    known = {storage.path(h.path): loaded[h.path] for h in handles if h.path in loaded}
    damaged = f"{StateFileError.MARK}{DAMAGED}"  # a file failing to decode in a task: a refusal naming it
    if not ranged:
        return read_parquet(spark, storage.fs, paths, schema, sizes=sizes, loaded=known, damaged=damaged)
    column = FileColumn(_FILE)
    df = read_parquet(spark, storage.fs, paths, schema, column, sizes=sizes, loaded=known, damaged=damaged)
    files = [(F.lit(column.key(storage.fs, path)), span) for path, span in ranged]
    low = F.create_map(*[x for name, span in files for x in (name, F.lit(span[0]))])
    high = F.create_map(*[x for name, span in files for x in (name, F.lit(span[1]))])
    first, last = F.element_at(low, column.key_column()), F.element_at(high, column.key_column())
    group = key_group(tuple(keys), max_parallelism)
    message = F.concat(
        F.lit(f"{StateFileError.MARK}state file "),
        F.col(_FILE),
        F.lit(" holds a key of key group "),
        group.cast("string"),
        F.lit(", outside the range its handle records ["),
        first.cast("string"),
        F.lit(", "),
        last.cast("string"),
        F.lit("]: it is not the file the checkpoint wrote; restore another checkpoint or savepoint"),
    )
    outside = first.isNotNull() & ((group < first) | (group > last))
    return df.where(F.when(outside, F.raise_error(message)).otherwise(F.lit(True))).drop(_FILE)
