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
and ``''`` differ). Across checkpoints the later checkpoint's row replaces the earlier one,
whatever its ``sequence_by`` values (they order the rows of one checkpoint; the stored row is
not compared).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.exceptions import PipelineDefinitionError, SinkSchemaError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

_ROW, _ORDER = "__upsert_row", "__upsert_order"


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


def latest_per_key(uid: str, df: DataFrame, keys: Sequence[str], sequence_by: Sequence[str]) -> DataFrame:
    """``df`` with one row per key: the winner by :mod:`this module's <.upsert_rule>` rule.

    One aggregation by key (partial aggregation before the shuffle, so duplicates cost little);
    the source order is taken where the sink's input delivers its rows, before any shuffle.
    """
    from pyspark.sql import functions as F

    missing = [c for c in [*keys, *sequence_by] if c not in df.columns]
    if missing:
        raise SinkSchemaError(
            f"sink {uid}: the input has no column(s) {missing} (upsert keys {list(keys)}, sequence_by "
            f"{list(sequence_by)}); its columns are {df.columns}"
        )
    ordered = df.withColumn(_ORDER, F.monotonically_increasing_id())
    row = F.struct(*[F.col(f"`{c}`") for c in df.columns])
    order = F.struct(*[F.col(f"`{c}`") for c in sequence_by], F.col(_ORDER))
    latest = ordered.groupBy(*[F.col(f"`{k}`") for k in keys]).agg(F.max_by(row, order).alias(_ROW))
    return latest.select(*[F.col(_ROW)[c].alias(c) for c in df.columns])
