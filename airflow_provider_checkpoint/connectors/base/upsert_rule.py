"""One row per key in an upsert sink, whatever the input: the rule every upsert sink applies.

Several input rows for one key in one checkpoint (a backlog, a replay after an abort or a
restore, a source that sends a key twice) resolve to one row before the sink stages anything:

- with ``sequence_by`` columns, the row with the greatest values wins (compared in the order
  the columns are given; a null loses to any value), as Delta Live Tables' ``APPLY CHANGES …
  SEQUENCE BY`` does; rows that tie fall back to source order;
- otherwise the later row in source order wins: the order in which the sink's input delivers
  its rows (file sources: files by name, each file's records in line order; a Delta source:
  commits in version order, each file's rows in order). A shuffle upstream of the sink (a
  join, a repartition in a transform) loses that order: name ``sequence_by`` then.

Exact duplicates collapse. A key is compared as a whole, a null part like any value (``None``
and ``''`` differ). With ``delete_when`` (a boolean column), a winning row where it is true
deletes its key: a delete competes with the key's other rows by the same rule, so a later
upsert of the key in the checkpoint brings it back. Across checkpoints the later checkpoint's
row (or delete) replaces the earlier one, whatever its ``sequence_by`` values (they order the
rows of one checkpoint; the stored row is not compared, and a deleted key leaves nothing to
compare with): checkpoints follow the source's order (a Kafka partition's offsets, a database's
log), which is the order in which a change stream's changes happened.

:class:`UpsertRows` applies the rule in Spark (:func:`latest_per_key`) or, for a small input, in
the driver with pyarrow after one collect (:func:`latest_in_arrow`), with the same result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.exceptions import PipelineDefinitionError, SinkSchemaError

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql.types import DataType, StructType

    from airflow_provider_checkpoint.dataflow.driver_rows import DriverRows, LazyFrame, SourceRows

_ROW, _ORDER, _RANK = "__upsert_row", "__upsert_order", "__upsert_rank"


def _float_types() -> tuple[pa.DataType, ...]:
    import pyarrow as pa

    return (pa.float16(), pa.float32(), pa.float64())


def check_sequence_by(uid: str, mode: str, keys: Sequence[str], sequence_by: Sequence[str] | None) -> list[str]:
    """``sequence_by`` as a list; refused outside upsert mode, empty, repeated or naming a key."""
    if sequence_by is None:
        return []
    columns = [sequence_by] if isinstance(sequence_by, str) else list(sequence_by)
    if mode != "upsert":
        raise PipelineDefinitionError(f"{uid}: sequence_by applies to upsert mode only")
    if not columns or len(set(columns)) != len(columns) or not all(isinstance(c, str) and c for c in columns):
        raise PipelineDefinitionError(f"{uid}: sequence_by must name one or more distinct columns, got {sequence_by!r}")
    if clash := sorted(set(columns) & set(keys)):
        raise PipelineDefinitionError(f"{uid}: sequence_by column(s) {clash} are upsert keys")
    return columns


def check_delete_when(
    uid: str, mode: str, keys: Sequence[str], sequence_by: Sequence[str], delete_when: str | None
) -> str | None:
    """``delete_when`` (a boolean input column whose true value deletes the key), refused outside upsert mode
    or naming a key or a ``sequence_by`` column."""
    if delete_when is None:
        return None
    if mode != "upsert":
        raise PipelineDefinitionError(f"{uid}: delete_when applies to upsert mode only")
    if not isinstance(delete_when, str) or not delete_when or delete_when in [*keys, *sequence_by]:
        raise PipelineDefinitionError(
            f"{uid}: delete_when must name one boolean column, not a key or sequence_by column, got {delete_when!r}"
        )
    return delete_when


def check_delete_column(uid: str, delete_when: str | None, schema: StructType) -> None:
    """Refuse an input whose ``delete_when`` column is missing or not boolean."""
    if delete_when is None:
        return
    found = {f.name: f.dataType.simpleString() for f in schema.fields}.get(delete_when)
    if found != "boolean":
        raise SinkSchemaError(
            f"sink {uid}: delete_when column {delete_when!r} must be boolean, the input has "
            f"{found or 'no such column'}; its columns are {schema.fieldNames()}"
        )


def latest_per_key(uid: str, df: DataFrame, keys: Sequence[str], sequence_by: Sequence[str]) -> DataFrame:
    """``df`` with one row per key: the winner by :mod:`this module's <.upsert_rule>` rule.

    One aggregation by key (partial aggregation before the shuffle, so duplicates cost little);
    the source order is taken where the sink's input delivers its rows, before any shuffle.
    """
    from pyspark.sql import functions as F

    check_key_columns(uid, df.columns, keys, sequence_by)
    ordered = df.withColumn(_ORDER, F.monotonically_increasing_id())
    row = F.struct(*[F.col(f"`{c}`") for c in df.columns])
    order = F.struct(*[F.col(f"`{c}`") for c in sequence_by], F.col(_ORDER))
    latest = ordered.groupBy(*[F.col(f"`{k}`") for k in keys]).agg(F.max_by(row, order).alias(_ROW))
    return latest.select(*[F.col(_ROW)[c].alias(c) for c in df.columns])


def check_key_columns(uid: str, columns: list[str], keys: Sequence[str], sequence_by: Sequence[str]) -> None:
    """Refuse an upsert input of ``columns`` without its keys' or ``sequence_by``'s columns."""
    missing = [c for c in [*keys, *sequence_by] if c not in columns]
    if missing:
        raise SinkSchemaError(
            f"sink {uid}: the input has no column(s) {missing} (upsert keys {list(keys)}, sequence_by "
            f"{list(sequence_by)}); its columns are {columns}"
        )


def _comparable_in_arrow(t: DataType, floating: bool) -> bool:
    """Whether pyarrow groups (``floating=False``) or orders values of Spark type ``t`` as Spark does.
    Floats group differently (Spark equates every NaN, and -0.0 with 0.0); as ``sequence_by`` they order
    alike but for NaN, which the collect checks."""
    from pyspark.sql import types as T

    plain = (T.StringType, T.BinaryType, T.BooleanType, T.DateType, T.TimestampType, T.TimestampNTZType)
    numeric = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.DecimalType)
    return isinstance(t, plain + numeric) or (floating and isinstance(t, T.FloatType | T.DoubleType))


@dataclass(frozen=True)
class UpsertRows:
    """An upsert sink's input, one row per key by the rule where ``reduce`` (the input may repeat a key):
    :meth:`frame` in Spark, or :meth:`collect` into the driver when it is small; ``in_driver``: the
    input's rows when the driver holds them already (:mod:`~airflow_provider_checkpoint.dataflow.driver_rows`)."""

    uid: str
    df: DataFrame | LazyFrame | None
    """The input (a :class:`LazyFrame`: its DataFrame made only if Spark needs it, e.g. an operator's output the
    driver holds in :attr:`in_driver`), or ``None`` when it is :attr:`read` (its DataFrame made only if Spark
    needs it too)."""
    keys: Sequence[str]
    sequence_by: Sequence[str]
    reduce: bool
    in_driver: DriverRows | None = None
    count: int | None = None
    """How many rows the input has, when known: :meth:`collect` then runs no job for more than its limit."""
    read: SourceRows | None = None
    """The input as its source read it on the driver
    (:meth:`~airflow_provider_checkpoint.dataflow.graph.Source.read_in_driver`), with ``df`` ``None``."""

    def __post_init__(self) -> None:
        if (self.df is None) == (self.read is None):
            raise ValueError(f"sink {self.uid}: an upsert input is a DataFrame or rows read on the driver")

    @property
    def schema(self) -> StructType:
        """The input's columns (no Spark session needed for rows read on the driver)."""
        if self.read is not None:
            return self.read.schema
        assert self.df is not None  # __post_init__: one of the two
        return self.df.schema  # a LazyFrame's known without its DataFrame

    @property
    def source(self) -> pa.Table | None:
        """The input's rows, in its order, as ``toArrow()`` gives them, when its source read them on the driver."""
        return None if self.read is None else self.read.rows

    def _df(self) -> DataFrame:
        from airflow_provider_checkpoint.dataflow.driver_rows import frame_of

        assert self.df is not None  # __post_init__: one of the two
        return frame_of(self.df)

    def data(self) -> DataFrame:
        """The input as a DataFrame Spark reads (made now from rows read on the driver)."""
        return self.read.frame() if self.read is not None else self._df()

    def estimated_bytes(self) -> int | None:
        """The input's size: of the rows read on the driver, else Spark's estimate (``None``: unknown)."""
        from airflow_provider_checkpoint.dataflow.driver_rows import estimated_bytes

        return self.read.rows.nbytes if self.read is not None else estimated_bytes(self._df())

    def frame(self) -> DataFrame:
        """The rows as a DataFrame, reduced by Spark (one aggregation by key)."""
        data = self.data()
        return latest_per_key(self.uid, data, self.keys, self.sequence_by) if self.reduce else data

    def collect(self, limit: int, pmod: tuple[str, int] | None = None) -> pa.Table | None:
        """The rows in the driver, reduced there, with ``pmod`` ``(column, divisor)``'s column =
        ``pmod(xxhash64(keys), divisor)`` as Spark computes it (e.g. a bucket): from :attr:`source` without a
        Spark job when it has them and the driver hashes the keys' types as Spark does
        (:mod:`~airflow_provider_checkpoint.state.spark_hash`), else in one Spark job: with :attr:`count` known,
        ``toArrow()`` of the rows as they are, in the DataFrame's order (its partitions' in turn, as
        ``monotonically_increasing_id`` orders them; no ``limit``, which gathers the rows into one partition
        first, and no order column, which makes the JVM's hand-off twice as long: 1,000,000 narrow rows 0.32 s
        against 0.65 s with it, 0.57 s with the limit); else ``limit(limit + 1)`` with the order column.
        Rows its source read on the driver (:attr:`source`) are taken whatever their number: the source's own
        bound (a CDC source's ``driver_read_bytes``, a Parquet ``FileSource``'s input bytes) holds them there
        already, and Spark would first copy them out of the driver (``createDataFrame``). ``None`` if ``limit``
        is 0, the input (not read on the driver) has more than ``limit`` rows, or key or ``sequence_by`` values
        pyarrow cannot compare as Spark does: use :meth:`frame` then."""
        from pyspark.sql import functions as F

        if not limit:
            return None
        schema = self.schema
        check_key_columns(self.uid, schema.fieldNames(), self.keys, self.sequence_by)
        types = {f.name: f.dataType for f in schema.fields}
        if self.reduce and not (
            all(_comparable_in_arrow(types[k], floating=False) for k in self.keys)
            and all(_comparable_in_arrow(types[c], floating=True) for c in self.sequence_by)
        ):
            return None
        if self.source is not None:
            rows = self._from_source(pmod)
            if rows is not None:
                return rows
        if self.count is not None and self.count > limit:
            return None
        df = self.data()
        if pmod is not None:
            df = df.withColumn(pmod[0], F.pmod(F.xxhash64(*[F.col(k) for k in self.keys]), F.lit(pmod[1])))
        if self.count is not None:
            rows = df.toArrow()
            return None if rows.num_rows > limit else self._reduced(self._ordered(rows))
        if self.reduce:
            df = df.withColumn(_ORDER, F.monotonically_increasing_id())
        rows = df.limit(limit + 1).toArrow()
        return None if rows.num_rows > limit else self._reduced(rows)

    def _from_source(self, pmod: tuple[str, int] | None) -> pa.Table | None:
        """:meth:`collect` from :attr:`source` (in source order), or ``None`` for keys the driver does not hash as
        Spark does."""
        import numpy as np

        from airflow_provider_checkpoint.dataflow.driver_rows import pmod as spark_pmod
        from airflow_provider_checkpoint.fileio.arrow_numpy import arrow_of
        from airflow_provider_checkpoint.state.spark_hash import hashable, xxhash64

        rows = self.source
        if rows is None:
            return None
        if pmod is not None:
            if not hashable(rows.schema, self.keys):
                return None
            buckets = spark_pmod(xxhash64(rows, self.keys).view(np.int64), pmod[1])
            rows = rows.append_column(pmod[0], arrow_of(buckets))
        return self._reduced(self._ordered(rows))

    def _ordered(self, rows: pa.Table) -> pa.Table:
        """``rows`` (in source order) with their position in ``_ORDER`` where the reduction orders by ``sequence_by``
        first (else their own order is the source order)."""
        import numpy as np

        from airflow_provider_checkpoint.fileio.arrow_numpy import arrow_of

        if self.reduce and self.sequence_by:
            return rows.append_column(_ORDER, arrow_of(np.arange(rows.num_rows, dtype=np.int64)))
        return rows

    def _reduced(self, rows: pa.Table) -> pa.Table | None:
        """``rows`` one per key if :attr:`reduce`, their source order in ``_ORDER`` or, without it, their own
        order; ``None`` if a NaN orders them."""
        import pyarrow.compute as pc

        if not self.reduce:
            return rows
        floats = [rows[c] for c in self.sequence_by if rows.schema.field(c).type in _float_types()]
        if any(pc.any(pc.is_nan(c)).as_py() for c in floats):  # Spark orders NaN above every value
            return None
        if _ORDER not in rows.column_names:
            return latest_in_arrow(rows, self.keys, [])
        return latest_in_arrow(rows, self.keys, [*self.sequence_by, _ORDER]).drop_columns([_ORDER])

    def held(self, pmod_column: str, divisor: int) -> pa.Table | None:
        """The rows as the driver holds them, with ``pmod_column`` = ``pmod(xxhash64(keys), divisor)`` as
        Spark computes it (e.g. a bucket), when they are held hashed by exactly these keys and need no
        reduction (one row per key already); ``None`` otherwise. No Spark job, whatever their number."""
        import pyarrow as pa

        held = self.in_driver
        if held is None or self.reduce or held.keys != tuple(self.keys):
            return None
        return held.rows().append_column(pmod_column, pa.array(held.pmod_of_keys(divisor)))


def latest_in_arrow(rows: pa.Table, keys: Sequence[str], order: Sequence[str]) -> pa.Table:
    """One row of ``rows`` per key (null-safe): the greatest by the ``order`` columns, a null below any value, or
    with no ``order`` the last in ``rows``' own order; in that order, or ``rows`` themselves, in their own order,
    when no key repeats (one integer key is checked by its index, :func:`unique_integer_key`, not grouped)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from airflow_provider_checkpoint.fileio.arrow_numpy import arrow_of, numpy_of

    if unique_integer_key(rows, keys):
        return rows
    ranked = (
        rows.take(pc.sort_indices(rows, sort_keys=[(c, "ascending", "at_start") for c in order])) if order else rows
    )
    lasts = _last_of_integer_keys(ranked, keys)
    if lasts is None:  # other keys: grouped by pyarrow (its group_by imports pyarrow.acero and pandas)
        rank = arrow_of(np.arange(ranked.num_rows, dtype=np.int64))
        by_key = pa.table([*(ranked[k] for k in keys), rank], names=[*keys, _RANK])
        last = by_key.group_by(list(keys), use_threads=False).aggregate([(_RANK, "max")])
        lasts = np.sort(numpy_of(last[f"{_RANK}_max"]))
    if len(lasts) == ranked.num_rows:
        return ranked
    return ranked.take(arrow_of(lasts))


def _last_of_integer_keys(rows: pa.Table, keys: Sequence[str]) -> np.ndarray | None:
    """The positions of each key's last row in ``rows``, ascending, for one integer key column without nulls (a
    stable sort of the values, no hashing); ``None`` for other keys."""
    import numpy as np
    import pyarrow as pa

    from airflow_provider_checkpoint.fileio.arrow_numpy import numpy_of

    if len(keys) != 1 or not pa.types.is_integer(rows.schema.field(keys[0]).type) or rows[keys[0]].null_count:
        return None
    values = numpy_of(rows[keys[0]])
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    last = np.ones(len(values), bool)
    last[:-1] = ordered[1:] != ordered[:-1]
    return np.sort(order[last])


def unique_integer_key(rows: pa.Table, keys: Sequence[str]) -> bool:
    """Whether ``rows`` has one key column, of an integer type, holding no value twice (a null is a value, as
    :func:`latest_in_arrow` groups it): one index of the values (:func:`~.bucket_merge.int_keys`: a bitmap over
    their span, else a sort; kept for a later lookup of the same keys), no hashing (≈ 20 ms for 1,000,000 keys
    sorted against 0.2–0.5 s for pyarrow's ``group_by``). ``False`` when it repeats one, or for other keys (not
    checked here)."""
    from airflow_provider_checkpoint.connectors.base.bucket_merge import int_keys

    index = int_keys(rows, keys)
    return index is not None and index.nulls <= 1 and not index.repeats
