"""Deduplication within an event-time horizon (Spark's ``dropDuplicatesWithinWatermark``).

:class:`Deduplicate` keeps the first row of each key and drops the later ones while the key's
state lives; the state is the keys and :data:`~airflow_provider_checkpoint.core.ttl.EXPIRES_AT`,
the first-seen event time plus ``within``. Per checkpoint N, with ``before`` the watermark of N-1
and ``after`` the one N reaches (:mod:`airflow_provider_checkpoint.core.event_time`):

- rows without event time are dropped (metric ``rows_without_event_time``), and so are rows at or
  before ``before`` (late: ``late_rows_dropped``), as Spark drops rows behind its watermark;
- a key whose state expires at or before ``before`` is gone; of the rows of a key without live
  state, the one with the smallest event time (ties: the smallest row, column by column) is
  emitted and its key kept until ``first-seen + within``; the others are duplicates;
- state expired at ``after`` is not kept (removed by this checkpoint, dropped from the files by
  the next compaction of its range): state size follows the keys seen within ``within``.

The output is append-only: a key may be emitted again once its state expired.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.core.event_time import WatermarkProgress, WatermarkSpec, duration_ms
from airflow_provider_checkpoint.core.model import Barrier
from airflow_provider_checkpoint.core.ttl import EXPIRES_AT
from airflow_provider_checkpoint.dataflow.expiry import TS_MS_UP, TS_US, advance, late, live_state, with_event_time
from airflow_provider_checkpoint.dataflow.graph import Node
from airflow_provider_checkpoint.dataflow.keyed_join import keys_match, other_side
from airflow_provider_checkpoint.dataflow.operator import StatefulOperator
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class Deduplicate(StatefulOperator):
    """The first row of each key within ``within`` of its event time; see the module.

    ``watermark=("ts", "10 minutes")``: the event-time column (a timestamp) and its bound of
    out-of-orderness; not given: the watermark declared on the sources upstream. Spark's
    ``dropDuplicatesWithinWatermark`` is this with ``within`` equal to the bound. The output has the
    input's columns.
    """

    def __init__(
        self,
        uid: str,
        input: Node,
        keys: Sequence[str],
        within: str,
        watermark: tuple[str, str] | None = None,
        max_parallelism: int = 128,
    ) -> None:
        super().__init__(uid, input, keys, max_parallelism)
        self.within_ms = duration_ms(within, f"{uid} within")
        if self.within_ms <= 0:
            raise PipelineDefinitionError(f"{uid}: within must be positive, got {within!r}")
        spec = self.own_watermark(watermark, "Deduplicate")
        assert spec is not None
        self.watermark: WatermarkSpec = spec

    def describe(self) -> dict[str, object]:
        return {
            **super().describe(),
            "within_ms": self.within_ms,
            "watermark": [self.watermark.column, self.watermark.bound_ms],
        }

    def initial_state(self, spark: SparkSession, inputs: Mapping[str, DataFrame]) -> DataFrame:
        from pyspark.sql import functions as F

        keys = inputs[self.inputs[0].uid].select(*self.keys, F.lit(None).cast("long").alias(EXPIRES_AT))
        return spark.createDataFrame([], keys.schema)

    def event_time(
        self, inputs: Mapping[str, DataFrame], before: WatermarkProgress, barrier: Barrier
    ) -> tuple[WatermarkProgress, dict[str, int]]:
        rows = with_event_time(inputs[self.inputs[0].uid], self.uid, self.watermark.column, keep_nulls=True)
        return advance(rows, before, self.watermark.bound_ms, late=late(before))

    def process_at(
        self,
        inputs: Mapping[str, DataFrame],
        state: DataFrame,
        barrier: Barrier,
        before: WatermarkProgress,
        after: WatermarkProgress,
    ) -> tuple[DataFrame, DataFrame]:
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        input = inputs[self.inputs[0].uid]
        rows = with_event_time(input, self.uid, self.watermark.column)
        rows = rows.where(~late(before))
        tie = [F.col(f.name).asc_nulls_first() for f in input.schema.fields if _orderable(f.dataType)]
        first = Window.partitionBy(*self.keys).orderBy(F.col(TS_US), *tie)
        firsts = rows.withColumn("__rank", F.row_number().over(first)).where(F.col("__rank") == 1)
        live = live_state(state, before.watermark)
        kept = firsts.join(other_side(live.select(*self.keys)), keys_match(self.keys), "left_anti").persist()
        seen = kept.select(*self.keys, (F.col(TS_MS_UP) + F.lit(self.within_ms)).alias(EXPIRES_AT))
        new_state = live_state(live.unionByName(seen.select(*state.columns)), after.watermark)
        return new_state, kept.select(*input.columns)


def _orderable(kind: object) -> bool:
    """Spark can sort by a column of this type (not a map, nor a struct or array holding one)."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(kind, MapType):
        return False
    if isinstance(kind, ArrayType):
        return _orderable(kind.elementType)
    if isinstance(kind, StructType):
        return all(_orderable(f.dataType) for f in kind.fields)
    return True
