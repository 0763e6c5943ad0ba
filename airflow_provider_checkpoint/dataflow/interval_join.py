"""``IntervalJoin``: pairs of two keyed streams whose times lie within a bound of each other.

Every pair is emitted exactly once, in the checkpoint where its later row arrives; each side's rows
wait in keyed state until the other side can no longer bring a partner, and then leave it.

**On event time** (``lower`` and ``upper`` are durations, the time columns timestamps), as Flink's
interval join: each input has a watermark of its own (``out_of_orderness``, else the ``watermark=``
of the sources upstream, on that side's time column) and the join's is their minimum, with
``idle_after`` leaving out an input without rows for that long
(:func:`~airflow_provider_checkpoint.core.event_time.combine`), stored in the snapshot like every
event-time operator's. A row at or before the watermark before the checkpoint is late: dropped and
counted (``late_rows_dropped``); a row without time is dropped too (``rows_without_event_time``).
After the checkpoint a left row leaves the state once ``time + upper`` is at or before the watermark
it reached, a right row once ``time - lower`` is: no later row that is not late can pair with it.

**On numbers** (``lower`` and ``upper`` numbers, the times numbers in the same unit): the watermark
is the smaller of the two sides' greatest time seen minus ``out_of_orderness``, kept in a row of the
state; a row *before* it is late, and rows leave the state once ``time + upper`` (left) or
``time - lower`` (right) is below it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.core.event_time import WatermarkProgress, WatermarkSpec, combine, duration_ms
from airflow_provider_checkpoint.core.model import Barrier
from airflow_provider_checkpoint.dataflow.expiry import TS_US, late, observe_each, with_event_time
from airflow_provider_checkpoint.dataflow.graph import Node
from airflow_provider_checkpoint.dataflow.operator import StatefulOperator
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession


class IntervalJoin(StatefulOperator):
    """Pairs of ``left`` and ``right`` rows with equal keys and ``l.time + lower <= r.time <= l.time + upper``.

    ``lower``/``upper``: durations (``"-5 minutes"``, ``"10 minutes"``) over timestamp columns, the
    join on event time; or numbers in the unit of numeric time columns (e.g. epoch milliseconds).
    ``out_of_orderness``: on event time, a duration bounding both inputs' disorder (default: each
    input's sources' ``watermark=``); on numbers, a number (default 0). ``idle_after`` (event time): an
    input without rows for that long of barrier time holds the watermark no longer. The output has
    the keys, then the other columns of left and right (which must not clash). See the module for
    when rows are late and when they leave the state.
    """

    one_row_per_key = False

    def __init__(
        self,
        uid: str,
        left: Node,
        right: Node,
        keys: Sequence[str],
        left_time: str,
        right_time: str,
        lower: float | str,
        upper: float | str,
        out_of_orderness: float | str | None = None,
        idle_after: str | None = None,
        max_parallelism: int = 128,
    ) -> None:
        super().__init__(uid, [left, right], keys, max_parallelism)
        self.left, self.right = left.uid, right.uid
        self.left_time, self.right_time = left_time, right_time
        self.on_event_time = isinstance(lower, str) or isinstance(upper, str)
        if self.on_event_time != (isinstance(lower, str) and isinstance(upper, str)):
            raise PipelineDefinitionError(
                f"{uid}: lower and upper must both be durations (e.g. '-5 minutes', '10 minutes') or both numbers"
            )
        self.lower: float = _signed_ms(lower, f"{uid} lower") if isinstance(lower, str) else lower
        self.upper: float = _signed_ms(upper, f"{uid} upper") if isinstance(upper, str) else upper
        if self.on_event_time:
            if out_of_orderness is not None and not isinstance(out_of_orderness, str):
                raise PipelineDefinitionError(
                    f"{uid}: out_of_orderness must be a duration such as '1 minute' when the bounds are durations"
                )
            self.bounds = {
                side.uid: self._bound(side, time, out_of_orderness)
                for side, time in ((left, left_time), (right, right_time))
            }
            self.idle_after_ms = None if idle_after is None else duration_ms(idle_after, f"{uid} idle_after")
        else:
            if idle_after is not None:
                raise PipelineDefinitionError(f"{uid}: idle_after needs the join on event time (durations as bounds)")
            if isinstance(out_of_orderness, str):
                raise PipelineDefinitionError(f"{uid}: out_of_orderness must be a number when the bounds are numbers")
            if (out_of_orderness or 0) < 0:
                raise PipelineDefinitionError(f"{uid}: out_of_orderness must not be negative")
        if self.lower > self.upper:
            raise PipelineDefinitionError(f"{uid}: lower bound {lower} is above upper bound {upper}")
        self.out_of_orderness = out_of_orderness if self.on_event_time else out_of_orderness or 0

    def _bound(self, side: Node, time: str, given: str | None) -> int:
        """The bound of out-of-orderness (ms) of ``side``'s watermark on its time column ``time``."""
        spec = WatermarkSpec(time, duration_ms(given, f"{self.uid} out_of_orderness")) if given else None
        spec = spec or side.upstream_watermark()
        if spec is None:
            raise PipelineDefinitionError(
                f"{self.uid}: no watermark for input {side.uid}: give out_of_orderness='1 minute' here, or "
                f"watermark=({time!r}, '1 minute') on the source(s) it reads"
            )
        if spec.column != time:
            raise PipelineDefinitionError(
                f"{self.uid}: watermark column {spec.column!r} of input {side.uid} must be its time column {time!r}"
            )
        return spec.bound_ms

    def describe(self) -> dict[str, object]:
        timed = {"watermarks": self.bounds, "idle_after_ms": self.idle_after_ms} if self.on_event_time else {}
        return {
            **super().describe(),
            "bounds": [self.lower, self.upper],
            "out_of_orderness": self.out_of_orderness,
            **timed,
        }

    def state_declaration(self) -> dict[str, str]:
        """On event time, the unit of the stored times: such state is refused by the join on numbers
        (whose state, declared before this existed, declares nothing; :meth:`process_at` refuses it)."""
        return {"times": "event time (µs)"} if self.on_event_time else {}

    def initial_state(self, spark: SparkSession, inputs: Mapping[str, DataFrame]) -> DataFrame:
        return self._template(inputs[self.left], inputs[self.right])

    def _template(self, left: DataFrame, right: DataFrame) -> DataFrame:
        """Empty state: side (``L``, ``R``; on numbers also ``W``, the watermark row), keys, time, the row
        of each side (on numbers also both sides' greatest times)."""
        from pyspark.sql import functions as F

        clash = (set(left.columns) & set(right.columns)) - set(self.keys)
        if clash:
            raise PipelineDefinitionError(f"{self.uid}: left and right both have columns {sorted(clash)}")
        marks = [] if self.on_event_time else [F.lit(None).cast("double").alias(c) for c in ("_max_left", "_max_right")]
        return left.limit(0).select(
            F.lit("L").alias("_side"),
            *[F.col(k) for k in self.keys],
            F.lit(None).cast("long" if self.on_event_time else "double").alias("_time"),
            F.struct(*[F.col(c) for c in left.columns]).alias("_left"),
            F.lit(None).cast(right.schema.simpleString()).alias("_right"),
            *marks,
        )

    def event_time(
        self, inputs: Mapping[str, DataFrame], before: WatermarkProgress, barrier: Barrier
    ) -> tuple[WatermarkProgress, dict[str, int]] | None:
        """On event time: one job over both inputs' times, for each its greatest, its late rows and its
        rows without time; the watermark is :func:`combine`'s."""
        if not self.on_event_time:
            return None
        from functools import reduce

        from pyspark.sql import functions as F

        times = [
            with_event_time(inputs[uid], self.uid, time, keep_nulls=True).select(TS_US, F.lit(i).alias("side"))
            for i, (uid, time) in enumerate(((self.left, self.left_time), (self.right, self.right_time)))
        ]
        seen = observe_each(reduce(lambda a, b: a.unionByName(b), times), "side", late(before))
        metrics = {
            "late_rows_dropped": sum(s.late for s in seen.values()),
            "rows_without_event_time": sum(s.untimed for s in seen.values()),
        }
        tops = {uid: seen[i].top if i in seen else None for i, uid in enumerate(self.bounds)}
        return combine(before, tops, self.bounds, round(barrier.trigger_time * 1000), self.idle_after_ms), metrics

    def process_at(
        self,
        inputs: Mapping[str, DataFrame],
        state: DataFrame,
        barrier: Barrier,
        before: WatermarkProgress,
        after: WatermarkProgress,
    ) -> tuple[DataFrame, DataFrame]:
        from pyspark.sql import functions as F

        if "_max_left" in state.columns:
            raise PipelineDefinitionError(
                f"{self.uid}: its state was written by the join on numbers; give the join on event time a new uid "
                "(restore with allow_non_restored_state to drop the old state)"
            )
        left, right = inputs[self.left], inputs[self.right]

        def side(rows: DataFrame, time: str, name: str) -> DataFrame:
            timed = with_event_time(rows, self.uid, time).where(~late(before))
            struct = F.struct(*[F.col(c) for c in rows.columns]).alias(name)
            return timed.select(*self.keys, F.col(TS_US).alias("_time"), struct)

        mark = None if after.watermark is None else F.lit(after.watermark * 1000)
        keep = (
            None
            if mark is None
            else (F.col("_time") + F.lit(self.upper * 1000) > mark, F.col("_time") - F.lit(self.lower * 1000) > mark)
        )
        return self._join(
            left,
            right,
            state,
            side(left, self.left_time, "_left"),
            side(right, self.right_time, "_right"),
            (self.lower * 1000, self.upper * 1000),
            keep,
        )

    def process(
        self, inputs: Mapping[str, DataFrame], state: DataFrame, barrier: Barrier
    ) -> tuple[DataFrame, DataFrame]:
        """On numbers: the watermark from the ``W`` row, updated with this checkpoint's greatest times."""
        from pyspark.sql import functions as F

        left, right = inputs[self.left], inputs[self.right]
        marks = state.where(F.col("_side") == "W").select("_max_left", "_max_right").collect()
        old_left, old_right = (marks[0][0], marks[0][1]) if marks else (None, None)
        seen = left.agg(F.max(F.col(self.left_time).cast("double"))).first()
        seen_right = right.agg(F.max(F.col(self.right_time).cast("double"))).first()
        max_left = _max(old_left, seen[0] if seen else None)
        max_right = _max(old_right, seen_right[0] if seen_right else None)
        old_wm = _watermark(old_left, old_right, float(self.out_of_orderness or 0))
        new_wm = _watermark(max_left, max_right, float(self.out_of_orderness or 0))

        new_l = left.select(
            *self.keys, F.col(self.left_time).cast("double").alias("_time"), F.struct("*").alias("_left")
        )
        new_r = right.select(
            *self.keys, F.col(self.right_time).cast("double").alias("_time"), F.struct("*").alias("_right")
        )
        if old_wm is not None:
            new_l = new_l.where(F.col("_time") >= F.lit(old_wm))
            new_r = new_r.where(F.col("_time") >= F.lit(old_wm))
        keep = (
            None
            if new_wm is None
            else (
                F.col("_time") + F.lit(self.upper) >= F.lit(new_wm),
                F.col("_time") - F.lit(self.lower) >= F.lit(new_wm),
            )
        )
        mark = left.sparkSession.createDataFrame(
            [("W", max_left, max_right)], "_side string, _max_left double, _max_right double"
        )
        new_state, output = self._join(left, right, state, new_l, new_r, (self.lower, self.upper), keep)
        return new_state.unionByName(mark, allowMissingColumns=True), output

    def _join(
        self,
        left: DataFrame,
        right: DataFrame,
        state: DataFrame,
        new_l: DataFrame,
        new_r: DataFrame,
        bounds: tuple[float, float],
        keep: tuple[Column, Column] | None,
    ) -> tuple[DataFrame, DataFrame]:
        """The pairs a new row makes (with a stored row or another new one) and the rows kept: the
        stored and new rows of each side that ``keep`` (left, right; ``None``: all) holds."""
        from pyspark.sql import functions as F

        template = self._template(left, right)
        keys = list(self.keys)
        old_l = state.where(F.col("_side") == "L").select(*keys, "_time", "_left")
        old_r = state.where(F.col("_side") == "R").select(*keys, "_time", "_right")

        def pairs(ls: DataFrame, rs: DataFrame) -> DataFrame:
            cond = [ls[k].eqNullSafe(rs[k]) for k in keys] + [
                rs["_time"] >= ls["_time"] + F.lit(bounds[0]),
                rs["_time"] <= ls["_time"] + F.lit(bounds[1]),
            ]
            return (
                ls.alias("l").join(rs.alias("r"), cond).select(*[F.col(f"l.{k}") for k in keys], "l._left", "r._right")
            )

        matched = pairs(new_l, old_r.unionByName(new_r)).unionByName(pairs(old_l, new_r))
        others = [c for c in left.columns if c not in keys] + [c for c in right.columns if c not in keys]
        output = matched.select(
            *keys,
            *[F.col(f"_left.{c}").alias(c) for c in left.columns if c not in keys],
            *[F.col(f"_right.{c}").alias(c) for c in right.columns if c not in keys],
        ).select(*keys, *others)
        kept_l, kept_r = old_l.unionByName(new_l), old_r.unionByName(new_r)
        if keep is not None:
            kept_l, kept_r = kept_l.where(keep[0]), kept_r.where(keep[1])
        new_state = template.unionByName(kept_l.withColumn("_side", F.lit("L")), allowMissingColumns=True).unionByName(
            kept_r.withColumn("_side", F.lit("R")), allowMissingColumns=True
        )
        return new_state.select(*template.columns), output


def _signed_ms(value: str, what: str) -> int:
    """A duration that may be negative (``"-5 minutes"``) in milliseconds."""
    text = value.strip() if isinstance(value, str) else value
    negative = isinstance(text, str) and text.startswith("-")
    ms = duration_ms(text[1:] if negative else text, what)
    return -ms if negative else ms


def _max(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def _watermark(max_left: float | None, max_right: float | None, out_of_orderness: float) -> float | None:
    if max_left is None or max_right is None:
        return None
    return min(max_left, max_right) - out_of_orderness
