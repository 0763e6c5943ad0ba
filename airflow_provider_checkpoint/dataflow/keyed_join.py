"""Joins of two sides by key columns in Spark: null keys equal, column names unambiguous."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


OTHER = "__other_"
"""Prefix of the columns of a join's other side (:func:`other_side`): joins by name stay unambiguous."""


def other_side(df: DataFrame) -> DataFrame:
    """``df`` with every column prefixed by :data:`OTHER`, for :func:`keys_match`."""
    from pyspark.sql import functions as F

    return df.select(*[F.col(c).alias(OTHER + c) for c in df.columns])


def keys_match(keys: Sequence[str]) -> Column:
    """Join condition with an :func:`other_side`: equal keys, a null key equal to a null key
    (state has one row per key, null or not)."""
    from functools import reduce

    from pyspark.sql import functions as F

    return reduce(lambda a, b: a & b, [F.col(k).eqNullSafe(F.col(OTHER + k)) for k in keys])
