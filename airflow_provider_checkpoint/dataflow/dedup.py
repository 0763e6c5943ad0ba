"""Deduplication within an event-time horizon (Spark's ``dropDuplicatesWithinWatermark``).

:class:`Deduplicate` keeps the first row of each key and drops the later ones while the key's
state lives; the state is the keys and :data:`~airflow_provider_checkpoint.core.ttl.EXPIRES_AT`,
the first-seen event time plus ``within``. Per checkpoint N, with ``before`` the watermark of N-1
and ``after`` the one N reaches (:mod:`airflow_provider_checkpoint.core.event_time`):

- rows without event time are dropped (metric ``rows_without_event_time``), and so are rows at or
  before ``before`` (late: ``late_rows_dropped``), as Spark drops rows behind its watermark; with
  ``late="output"`` the late rows go instead, as they came, to :attr:`Deduplicate.late_data`
  (``late_rows_output``), committed with the checkpoint like every output;
- a key whose state expires at or before ``before`` is gone; of the rows of a key without live
  state, the one with the smallest event time (ties: the smallest row, column by column) is
  emitted and its key kept until ``first-seen + within``; the others are duplicates;
- state expired at ``after`` is not kept (removed by this checkpoint, dropped from the files by
  the next compaction of its range): state size follows the keys seen within ``within``.

The output is append-only: a key may be emitted again once its state expired.

With ``ttl=`` (processing time) instead of ``within``, there is no event time: a key's state lives
``ttl`` after the trigger time of the checkpoint that first saw it (``update="on_read_and_write"``:
of the last checkpoint with a row of it), read and kept by that trigger time (:class:`~.core.ttl.Clocks`);
of the rows of a key without live state, the smallest (column by column) is emitted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.core.event_time import WatermarkProgress, WatermarkSpec, duration_ms
from airflow_provider_checkpoint.core.model import Barrier
from airflow_provider_checkpoint.core.ttl import EXPIRES_AT, TTL, Clocks
from airflow_provider_checkpoint.dataflow.expiry import (
    EVENT_TIME_COLUMNS,
    TS_MS_UP,
    TS_US,
    advance,
    late,
    live_state,
    with_event_time,
)
from airflow_provider_checkpoint.dataflow.graph import Node
from airflow_provider_checkpoint.dataflow.keyed_join import keys_match, other_side
from airflow_provider_checkpoint.dataflow.late_data import LateOutput
from airflow_provider_checkpoint.dataflow.operator import StatefulOperator
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession


class Deduplicate(LateOutput, StatefulOperator):
    """The first row of each key within ``within`` of its event time; see the module.

    ``watermark=("ts", "10 minutes")``: the event-time column (a timestamp) and its bound of
    out-of-orderness; not given: the watermark declared on the sources upstream. Spark's
    ``dropDuplicatesWithinWatermark`` is this with ``within`` equal to the bound. The output has the
    input's columns. ``late="drop"`` drops late rows and counts them; ``late="output"`` sends them,
    as they came, to :attr:`late_data`, a second output a sink takes as its input (as
    :class:`~.windows.WindowAggregate`'s). ``ttl="1 day"`` (or a processing-time :class:`TTL`)
    instead of ``within``: keys expire by the checkpoints' trigger time, no watermark involved.
    """

    def __init__(
        self,
        uid: str,
        input: Node,
        keys: Sequence[str],
        within: str | None = None,
        watermark: tuple[str, str] | None = None,
        max_parallelism: int = 128,
        late: str = "drop",
        ttl: str | TTL | None = None,
    ) -> None:
        super().__init__(uid, input, keys, max_parallelism)
        if late not in ("drop", "output"):
            raise PipelineDefinitionError(f"{uid}: late must be 'drop' or 'output', got {late!r}")
        self.late = late
        if (within is None) == (ttl is None):
            raise PipelineDefinitionError(
                f"{uid}: give within= (event time, e.g. '1 day') or ttl= (processing time), one of them"
            )
        self.ttl = None if ttl is None else TTL.of(ttl, uid)
        self.watermark: WatermarkSpec | None = None
        if self.ttl is not None:
            if self.ttl.time != "processing":
                raise PipelineDefinitionError(f"{uid}: ttl= expires by processing time; for event time use within=")
            if watermark is not None or late != "drop":
                raise PipelineDefinitionError(
                    f"{uid}: watermark= and late= go with within= (event time); with ttl= remove them"
                )
            return
        assert within is not None
        self.within_ms = duration_ms(within, f"{uid} within")
        if self.within_ms <= 0:
            raise PipelineDefinitionError(f"{uid}: within must be positive, got {within!r}")
        self.watermark = self.own_watermark(watermark, "Deduplicate")

    def describe(self) -> dict[str, object]:
        if self.ttl is not None:
            return {**super().describe(), "ttl": self.ttl.describe()}
        assert self.watermark is not None
        return {
            **super().describe(),
            "within_ms": self.within_ms,
            "watermark": [self.watermark.column, self.watermark.bound_ms],
            **({"late": self.late} if self.late != "drop" else {}),
        }

    def state_declaration(self) -> dict[str, str]:
        """The clock of the keys' expiry times: event time (``within=``) or processing time (``ttl=``)."""
        return {"expiry": "by processing time (ttl=)" if self.ttl is not None else "by event time (within=)"}

    def initial_state(self, spark: SparkSession, inputs: Mapping[str, DataFrame]) -> DataFrame:
        from pyspark.sql import functions as F

        keys = inputs[self.inputs[0].uid].select(*self.keys, F.lit(None).cast("long").alias(EXPIRES_AT))
        return spark.createDataFrame([], keys.schema)

    def event_time(
        self, inputs: Mapping[str, DataFrame], before: WatermarkProgress, barrier: Barrier
    ) -> tuple[WatermarkProgress, dict[str, int]] | None:
        if self.watermark is None:
            return None
        rows = with_event_time(inputs[self.inputs[0].uid], self.uid, self.watermark.column, keep_nulls=True)
        after, metrics = advance(rows, before, self.watermark.bound_ms, late=late(before))
        if self.late == "output":
            metrics["late_rows_output"] = metrics.pop("late_rows_dropped")
        return after, metrics

    def process_at(
        self,
        inputs: Mapping[str, DataFrame],
        state: DataFrame,
        barrier: Barrier,
        before: WatermarkProgress,
        after: WatermarkProgress,
    ) -> tuple[DataFrame, DataFrame]:
        from pyspark.sql import functions as F

        assert self.watermark is not None
        input = inputs[self.inputs[0].uid]
        rows = with_event_time(input, self.uid, self.watermark.column)
        if self.late == "output":
            self._late_rows = rows.where(late(before)).drop(*EVENT_TIME_COLUMNS)
        live = live_state(state, before.watermark)
        kept = self._firsts(rows.where(~late(before)), live, F.col(TS_US)).persist()
        seen = kept.select(*self.keys, (F.col(TS_MS_UP) + F.lit(self.within_ms)).alias(EXPIRES_AT))
        new_state = live_state(live.unionByName(seen.select(*state.columns)), after.watermark)
        return new_state, kept.select(*input.columns)

    def process(
        self, inputs: Mapping[str, DataFrame], state: DataFrame, barrier: Barrier
    ) -> tuple[DataFrame, DataFrame]:
        """With ``ttl=``: keys live until their expiry by the trigger time; see the module."""
        from pyspark.sql import functions as F

        assert self.ttl is not None
        input = inputs[self.inputs[0].uid]
        now = Clocks.of_checkpoint(barrier.trigger_time).processing
        live = live_state(state, now)
        kept = self._firsts(input, live).persist()
        expiry = F.lit(now + self.ttl.ms).alias(EXPIRES_AT)
        seen = kept.select(*self.keys, expiry)
        if self.ttl.update == "on_read_and_write":  # a duplicate reads the key's state: renewed
            read = input.select(*self.keys).distinct().join(other_side(live), keys_match(self.keys), "left_semi")
            live = live.join(other_side(read), keys_match(self.keys), "left_anti")
            seen = seen.unionByName(read.select(*self.keys, expiry))
        return live.unionByName(seen.select(*state.columns)), kept.select(*input.columns)

    def _firsts(self, rows: DataFrame, live: DataFrame, *first: Column) -> DataFrame:
        """Of ``rows``, the first of each key without ``live`` state: by ``first``, then column by column."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        tie = [F.col(f.name).asc_nulls_first() for f in rows.schema.fields if _orderable(f.dataType)]
        order = Window.partitionBy(*self.keys).orderBy(*first, *tie)
        firsts = rows.withColumn("__rank", F.row_number().over(order)).where(F.col("__rank") == 1).drop("__rank")
        return firsts.join(other_side(live.select(*self.keys)), keys_match(self.keys), "left_anti")


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
