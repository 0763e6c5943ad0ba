"""A node's output that is also held in the driver as Arrow, so a consumer can skip a Spark round trip.

A stateful operator merged on the driver (:mod:`~airflow_provider_checkpoint.state.driver_merge`)
has its output rows in the driver before it hands them to Spark. An upsert sink reading that output
merges its buckets in the driver from these rows directly: no Spark job collects them back, and no
row limit applies (the driver holds them already). Bucketing needs Spark's hash of the keys, which
the driver cannot compute itself bit for bit; the rows carry it (:data:`KEY_HASH`), computed by
Spark in the job that collected the operator's input.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

KEY_HASH = "__key_hash"
"""Spark's ``xxhash64`` of the key columns, in the order of :attr:`DriverRows.keys`."""


def key_hash(keys: tuple[str, ...]) -> Column:
    """Spark's hash of ``keys`` as :data:`KEY_HASH` holds it (``pmod`` of it gives key groups and buckets)."""
    from pyspark.sql import functions as F

    return F.xxhash64(*[F.col(k) for k in keys])


def pmod(hashes: np.ndarray, divisor: int) -> np.ndarray:
    """Spark's ``pmod(hash, divisor)`` of each int64 of ``hashes`` (``divisor`` above 0): in ``[0, divisor)``."""
    import numpy as np

    return np.mod(hashes, np.int64(divisor))


def estimated_bytes(df: DataFrame) -> int | None:
    """Spark's estimate of ``df``'s size (its optimized plan's statistics), before rows are collected into the
    driver; ``None`` if unknown. Over Spark Connect (no JVM side here) the server's, from its cost explain of the
    plan (one ``AnalyzePlan`` call, :func:`explained_bytes`)."""
    jdf = getattr(df, "_jdf", None)
    if jdf is not None:
        return int(str(jdf.queryExecution().optimizedPlan().stats().sizeInBytes()))
    explain = getattr(df, "_explain_string", None)
    return None if explain is None else explained_bytes(explain(mode="cost"))


def rows_then_bytes_within(rows: int | None, max_rows: int, size: Callable[[], int | None], max_bytes: int) -> bool:
    """Whether an input may be taken into the driver by two bounds, checked in turn: ``rows`` known (``None``: not)
    and at most ``max_rows``, then (asked only then) ``size`` known and at most ``max_bytes``, e.g. Spark's estimate
    (:func:`estimated_bytes`, which may cost a call to the server). A bound of 0: never."""
    if not max_rows or not max_bytes or rows is None or rows > max_rows:
        return False
    estimate = size()
    return estimate is not None and estimate <= max_bytes


_RANGE_SPLITS = re.compile(r"\bRange \(0, 1, step=1, splits=([0-9]+)\)")


def task_slots(spark: SparkSession) -> int:
    """The task slots of ``spark``'s cluster: its ``defaultParallelism``. Over Spark Connect (no JVM in this
    process) the server's, as the splits Spark plans for a range it is given no count of (one ``AnalyzePlan``
    call, no job); 1 if the plan does not show them."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except AttributeError:  # pyspark's Connect session refuses the JVM-only attribute with an AttributeError
        pass
    explained = getattr(spark.range(1), "_explain_string")(mode="simple")  # noqa: B009  # Connect's DataFrame
    found = _RANGE_SPLITS.search(explained)
    return max(int(found.group(1)), 1) if found else 1


_SIZE_UNITS = {"B": 0, "KiB": 10, "MiB": 20, "GiB": 30, "TiB": 40, "PiB": 50, "EiB": 60}
_PLAN_STATISTICS = re.compile(r"Statistics\(sizeInBytes=([0-9]+(?:\.[0-9]+)?) (B|KiB|MiB|GiB|TiB|PiB|EiB)[,)]")


def explained_bytes(explained: str) -> int | None:
    """The size of the root of the optimized plan in Spark's ``explain(mode="cost")`` text (printed to one
    decimal of its unit: rounded up here, so a size at a limit is not taken for one below it); ``None``
    without that section or its statistics."""
    _, found, plan = explained.partition("== Optimized Logical Plan ==")
    first = _PLAN_STATISTICS.search(plan.split("\n== ", 1)[0]) if found else None
    if first is None:
        return None
    value, shift = float(first.group(1)), _SIZE_UNITS[first.group(2)]
    return int(value) if shift == 0 else math.ceil((value + 0.05) * (1 << shift))


_DEFAULT_SIZES = {
    "boolean": 1, "byte": 1, "short": 2, "integer": 4, "long": 8, "float": 4, "double": 8, "date": 4,
    "timestamp": 8, "timestamp_ntz": 8, "string": 20, "binary": 100, "void": 1, "interval": 16,
}  # fmt: skip


def default_size(data_type: DataType) -> int | None:
    """Spark's ``DataType.defaultSize`` of ``data_type`` (the bytes its plan statistics assume a value takes),
    for the types a state or its input has; ``None`` for any other (a caller then knows no estimate)."""
    from pyspark.sql.types import ArrayType, DecimalType, MapType, StructType

    if isinstance(data_type, StructType):
        sizes = [default_size(f.dataType) for f in data_type.fields]
        return None if None in sizes else sum(s or 0 for s in sizes)
    if isinstance(data_type, ArrayType):
        return default_size(data_type.elementType)
    if isinstance(data_type, MapType):
        key, value = default_size(data_type.keyType), default_size(data_type.valueType)
        return None if key is None or value is None else key + value
    if isinstance(data_type, DecimalType):
        return 8 if data_type.precision <= 18 else 16
    return _DEFAULT_SIZES.get(data_type.typeName())


@dataclass(frozen=True)
class DriverRows:
    """The rows of a node's output DataFrame, in the driver: the same columns in the same order, plus
    :data:`KEY_HASH` of ``keys`` (one row per key: the node's ``unique_keys``)."""

    table: pa.Table
    keys: tuple[str, ...]

    def rows(self) -> pa.Table:
        """The rows as the DataFrame has them (without :data:`KEY_HASH`)."""
        return self.table.drop_columns([KEY_HASH])

    def pmod_of_keys(self, divisor: int) -> np.ndarray:
        """Per row, Spark's ``pmod(xxhash64(keys), divisor)`` (e.g. a bucket), as int64."""
        return pmod(self.table[KEY_HASH].to_numpy(), divisor)


@dataclass
class LazyFrame:
    """A node's output whose DataFrame is made by ``build`` only when a consumer asks for it (:meth:`frame`), its
    columns (``schema``, what that DataFrame's ``schema`` is) known before: e.g. an operator merged on the driver,
    whose rows the driver holds (:class:`DriverRows`) for a sink that takes them from there and never asks."""

    schema: StructType
    build: Callable[[], DataFrame]
    _frame: DataFrame | None = field(default=None, init=False, repr=False)

    def frame(self) -> DataFrame:
        """The DataFrame (made on the first call, the same one after)."""
        if self._frame is None:
            self._frame = self.build()
        return self._frame


def frame_of(data: DataFrame | LazyFrame) -> DataFrame:
    """``data``'s DataFrame: a :class:`LazyFrame`'s made now (:meth:`LazyFrame.frame`)."""
    return data.frame() if isinstance(data, LazyFrame) else data


class SourceRows(LazyFrame):
    """A source's output read on the driver: ``rows``, exactly what the source's DataFrame gives as
    ``toArrow()``, of Spark columns ``schema`` (what that DataFrame's ``schema`` is). The DataFrame itself
    is made by ``build`` only if a consumer ends up not taking the rows on the driver (:meth:`frame`):
    until then the step needs no Spark session."""

    def __init__(self, rows: pa.Table, schema: StructType, build: Callable[[], DataFrame]) -> None:
        super().__init__(schema, build)
        self.rows = rows
