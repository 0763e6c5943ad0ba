"""Session windows merged per key: the open sessions of the state and a checkpoint's new ones, relabelled
with the bounds of the session each merges into (one sort per key of the keys given)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

WINDOW_START = "window_start"
WINDOW_END = "window_end"
"""The bounds columns of a window's row (microsecond timestamps): its start, included, and its end, excluded."""


def merge_sessions(group_keys: Sequence[str], state: DataFrame, rows: DataFrame) -> tuple[DataFrame, DataFrame]:
    """The open sessions and the new rows' sessions, each relabelled with the bounds of the session
    it merges into: sessions of a key that overlap or touch (a start at most the greatest end before
    it) are one, whether they come from state or from this checkpoint. The state's rows keep their
    own bounds (``__old_start``, ``__old_end``) and ``__kept`` says whether they are the merged one's."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    spans = [*group_keys, WINDOW_START, WINDOW_END]
    tagged = state.select(*spans, F.struct(*state.columns).alias("__state")).unionByName(
        rows.select(*spans, F.struct(*rows.columns).alias("__row")), allowMissingColumns=True
    )
    order = Window.partitionBy(*group_keys).orderBy(WINDOW_START, WINDOW_END)
    before = F.max(WINDOW_END).over(order.rowsBetween(Window.unboundedPreceding, -1))
    opens = (before.isNull() | (F.col(WINDOW_START) > before)).cast("long")
    numbered = tagged.withColumn("__session", F.sum(opens).over(order.rowsBetween(Window.unboundedPreceding, 0)))
    same = Window.partitionBy(*group_keys, "__session")
    merged = (
        numbered.withColumn(WINDOW_START, F.min(WINDOW_START).over(same))
        .withColumn(WINDOW_END, F.max(WINDOW_END).over(same))
        .persist()  # split in two below
    )

    def side(struct: str, columns: list[str], *extra: Column) -> DataFrame:
        bounds = (WINDOW_START, WINDOW_END)
        return merged.where(F.col(struct).isNotNull()).select(
            *[F.col(c) if c in bounds else F.col(f"{struct}.{c}").alias(c) for c in columns], *extra
        )

    old_start, old_end = F.col(f"__state.{WINDOW_START}"), F.col(f"__state.{WINDOW_END}")
    olds = side(
        "__state",
        state.columns,
        ((old_start == F.col(WINDOW_START)) & (old_end == F.col(WINDOW_END))).alias("__kept"),
        old_start.alias("__old_start"),
        old_end.alias("__old_end"),
    )
    return olds, side("__row", rows.columns)
