"""Event-time windows: tumbling, sliding and session windows of keyed aggregates, closed by the watermark.

The watermark rule is :mod:`airflow_provider_checkpoint.core.event_time`'s. Per checkpoint N, with
``before`` the watermark of N-1 and ``after`` the one N reaches:

- each row is assigned to its windows (a tumbling window, every sliding window holding it, or
  a session ``[ts, ts + gap)``); a (row, window) pair whose ``window end + allowed_lateness <=
  before`` is late and dropped (a row none of whose windows is open counts in the
  ``late_rows_dropped`` metric; a row without event time in ``rows_without_event_time``);
- the open windows in state are merged with the new pairs (sessions that overlap or touch
  merge into one, across checkpoints);
- ``emit="final"``: every window with ``end + allowed_lateness <= after`` is emitted once, in
  this checkpoint, and purged from state (for append sinks); ``emit="update"``: every window
  that got rows in this checkpoint is emitted with its current aggregates (for upsert sinks
  keyed by the keys and ``window_start``, ``window_end``), and windows closed by ``after`` are
  purged without output.

The state holds one row per open window (the keys, ``window_start``, ``window_end`` and the
aggregates), so its size follows the open windows, not the job's age.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from airflow_provider_checkpoint.core.event_time import WatermarkProgress, WatermarkSpec, combine, duration_ms
from airflow_provider_checkpoint.core.model import Barrier
from airflow_provider_checkpoint.dataflow.expiry import EVENT_TIME_COLUMNS, TS_US, observe, with_event_time
from airflow_provider_checkpoint.dataflow.graph import Node, Transform, Union
from airflow_provider_checkpoint.dataflow.operator import NEW
from airflow_provider_checkpoint.dataflow.stateful import KeyedAggregate
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

WINDOW_START = "window_start"
WINDOW_END = "window_end"


@dataclass(frozen=True)
class Windows:
    """How rows are assigned to windows: ``size_ms`` and ``slide_ms`` (tumbling: equal), or ``gap_ms`` (sessions)."""

    kind: str
    size_ms: int = 0
    slide_ms: int = 0
    gap_ms: int = 0

    def describe(self) -> str:
        if self.kind == "session":
            return f"session(gap={self.gap_ms} ms)"
        return f"{self.kind}(size={self.size_ms} ms, slide={self.slide_ms} ms)"


def tumbling(size: str) -> Windows:
    """Fixed, non-overlapping windows ``[k * size, (k + 1) * size)`` (Spark's ``window(ts, size)``)."""
    ms = duration_ms(size, "tumbling window size")
    _positive(ms, "tumbling window size")
    return Windows("tumbling", ms, ms)


def sliding(size: str, slide: str) -> Windows:
    """Windows ``[k * slide, k * slide + size)``; a row is in every one that holds its event time
    (Spark's ``window(ts, size, slide)``, Flink's sliding event-time windows)."""
    ms, every = duration_ms(size, "sliding window size"), duration_ms(slide, "sliding window slide")
    _positive(ms, "sliding window size")
    _positive(every, "sliding window slide")
    if every > ms:
        raise PipelineDefinitionError(f"sliding window: slide {slide!r} must not exceed size {size!r}")
    return Windows("sliding", ms, every)


def session(gap: str) -> Windows:
    """A row opens ``[ts, ts + gap)``; windows of one key that overlap or touch merge into one
    (Spark's ``session_window(ts, gap)``, Flink's event-time session windows)."""
    ms = duration_ms(gap, "session gap")
    _positive(ms, "session gap")
    return Windows("session", gap_ms=ms)


def _first(df: DataFrame) -> int | None:
    row = df.first()
    return None if row is None else row[0]  # type: ignore[no-any-return]


def _ms(us: int | None) -> int | None:
    return None if us is None else us // 1000


def _positive(ms: int, what: str) -> None:
    if ms <= 0:
        raise PipelineDefinitionError(f"{what} must be positive")


class WindowAggregate(KeyedAggregate):
    """Keyed aggregates (``aggs`` as :class:`KeyedAggregate` takes them) per event-time window.

    ``time_column`` is a timestamp column of the input; ``watermark=(time_column, "10 minutes")``
    its bound of out-of-orderness, or, not given, the ``watermark=`` of the sources upstream. The
    output has the ``keys``, ``window_start``, ``window_end`` (timestamps) and the aggregates; see
    the module for what is emitted when. ``late="drop"`` drops late rows and counts them;
    ``late="output"`` sends them, as they came, to :attr:`late_data`, a second output a sink takes
    as its input (Flink's ``sideOutputLateData``), committed with the checkpoint like every output.

    Over a :class:`~.graph.Union`, each input of the union has a watermark of its own (the
    operator's bound, else its sources'), and the operator's is their minimum over the inputs not
    idle: with ``idle_after`` (a duration of barrier time), an input without rows for that long is
    left out until it has rows again (:func:`~airflow_provider_checkpoint.core.event_time.combine`).
    """

    reads_input_once = False  # read twice: for the watermark, then for the windows
    reads_union_inputs = True  # a watermark per input of a union

    def __init__(
        self,
        uid: str,
        input: Node,
        keys: Sequence[str],
        time_column: str,
        window: Windows,
        aggs: Mapping[str, str],
        watermark: tuple[str, str] | None = None,
        allowed_lateness: str = "0s",
        emit: str = "final",
        late: str = "drop",
        max_parallelism: int = 128,
        idle_after: str | None = None,
    ) -> None:
        clash = {WINDOW_START, WINDOW_END} & ({*keys} | set(aggs))
        if clash:
            raise PipelineDefinitionError(f"{uid}: {sorted(clash)} are the window's own columns; rename yours")
        super().__init__(uid, input, [*keys, WINDOW_START, WINDOW_END], aggs, max_parallelism)
        self.bounds = self._bounds(input, time_column, None if watermark is None else WatermarkSpec.of(watermark, uid))
        if idle_after is not None and len(self.bounds) < 2:
            raise PipelineDefinitionError(f"{uid}: idle_after needs several inputs (a Union as the input)")
        self.idle_after_ms = None if idle_after is None else duration_ms(idle_after, f"{uid} idle_after")
        if emit not in ("final", "update"):
            raise PipelineDefinitionError(f"{uid}: emit must be 'final' or 'update', got {emit!r}")
        if emit == "update" and window.kind == "session":
            raise PipelineDefinitionError(
                f"{uid}: emit='update' is not supported for session windows (a merged session would leave "
                "its earlier rows in the upsert sink); use emit='final'"
            )
        if late not in ("drop", "output"):
            raise PipelineDefinitionError(f"{uid}: late must be 'drop' or 'output', got {late!r}")
        self.late = late
        self._late_data: LateData | None = None
        self._late_rows: DataFrame | None = None
        self.group_keys = tuple(keys)
        self.time_column, self.window, self.emit = time_column, window, emit
        self.lateness_ms = duration_ms(allowed_lateness, f"{uid} allowed_lateness")

    def _bounds(self, input: Node, time_column: str, own: WatermarkSpec | None) -> dict[str, int]:
        """The bound of out-of-orderness (ms) of each input with a watermark of its own, by uid: the
        inputs of a union, else the one input."""
        members = input.inputs if isinstance(input, Union) else (input,)
        bounds = {}
        for member in members:
            spec = own or member.upstream_watermark()
            if spec is None:
                raise PipelineDefinitionError(
                    f"{self.uid}: no watermark for input {member.uid}: give watermark=({time_column!r}, "
                    f"'10 minutes') here, or watermark= on the source(s) it reads"
                )
            if spec.column != time_column:
                raise PipelineDefinitionError(
                    f"{self.uid}: watermark column {spec.column!r} (of input {member.uid}) must be the time "
                    f"column {time_column!r}"
                )
            bounds[member.uid] = spec.bound_ms
        return bounds

    @property
    def late_data(self) -> LateData:
        """The late rows of each checkpoint (``late="output"``): the input's rows none of whose windows
        was open, as they came; declare it inside the pipeline and give it to a sink."""
        if self.late != "output":
            raise PipelineDefinitionError(f"{self.uid}: late_data needs late='output'")
        if self._late_data is None:
            self._late_data = LateData(self)
        return self._late_data

    def late_rows(self) -> DataFrame:
        """The late rows of the checkpoint :meth:`process_at` last ran."""
        if self._late_rows is None:
            raise PipelineDefinitionError(f"{self.uid}: its late rows are read before the operator ran")
        return self._late_rows

    def describe(self) -> dict[str, object]:
        several = len(self.bounds) > 1
        return {
            **super().describe(),
            "window": self.window.describe(),
            "watermark": [self.time_column, self.bounds if several else next(iter(self.bounds.values()))],
            **({"idle_after_ms": self.idle_after_ms} if several else {}),
            "allowed_lateness_ms": self.lateness_ms,
            "emit": self.emit,
            **({"late": self.late} if self.late != "drop" else {}),
        }

    def initial_state(self, spark: SparkSession, inputs: Mapping[str, DataFrame]) -> DataFrame:
        return spark.createDataFrame([], self._partial(self._assigned(self._timed(inputs[self.inputs[0].uid]))).schema)

    def event_time(
        self, inputs: Mapping[str, DataFrame], before: WatermarkProgress, barrier: Barrier
    ) -> tuple[WatermarkProgress, dict[str, int]]:
        """One pass over the input: its greatest event time, its late rows and its rows without event time;
        over a union, one more pass per input of the union for its own greatest event time."""
        from pyspark.sql import functions as F

        rows = self._timed(inputs[self.inputs[0].uid], keep_nulls=True)
        seen = observe(rows, self._late(self._latest_end(), before))
        counted = "late_rows_output" if self.late == "output" else "late_rows_dropped"
        metrics = {counted: seen.late, "rows_without_event_time": seen.untimed}
        if len(self.bounds) == 1:
            return before.advance(seen.top, next(iter(self.bounds.values()))), metrics
        tops = {uid: _ms(_first(self._timed(inputs[uid]).agg(F.max(TS_US)))) for uid in self.bounds}
        now = round(barrier.trigger_time * 1000)
        return combine(before, tops, self.bounds, now, self.idle_after_ms), metrics

    def process_at(
        self,
        inputs: Mapping[str, DataFrame],
        state: DataFrame,
        barrier: Barrier,
        before: WatermarkProgress,
        after: WatermarkProgress,
    ) -> tuple[DataFrame, DataFrame]:
        from pyspark.sql import functions as F

        timed = self._timed(inputs[self.inputs[0].uid])
        if self.late == "output":
            self._late_rows = timed.where(self._late(self._latest_end(), before)).drop(*EVENT_TIME_COLUMNS)
        rows = self._assigned(timed).where(~self._late(F.unix_micros(WINDOW_END), before))
        if self.window.kind == "session":
            state, rows = self._sessions(state, rows)
        merged = self._aggregated_with(state, rows).persist()  # used twice
        closed = self._closes(after)
        emitted = merged.where(closed if self.emit == "final" else F.col("__touched"))
        # every state column, whatever the aggregates keep; the output without hidden ones
        return merged.where(~closed).drop("__touched", NEW), self.output_of(emitted.drop("__touched", NEW))

    def _timed(self, df: DataFrame, keep_nulls: bool = False) -> DataFrame:
        """``df`` with its event time (:func:`~.expiry.with_event_time`) by the time column."""
        return with_event_time(df, self.uid, self.time_column, keep_nulls)

    def _assigned(self, rows: DataFrame) -> DataFrame:
        """Each row once per window it belongs to, with ``window_start`` and ``window_end``."""
        from pyspark.sql import functions as F

        ts, w = F.col(TS_US), self.window
        if w.kind == "session":
            start, end = ts, ts + F.lit(w.gap_ms * 1000)
        else:
            last = ts - F.pmod(ts, F.lit(w.slide_ms * 1000))
            count = -(-w.size_ms // w.slide_ms)  # windows that can hold one time
            offsets = F.explode(F.sequence(F.lit(0), F.lit(count - 1))) if count > 1 else F.lit(0)
            rows = rows.withColumn("__offset", offsets)
            start = last - F.col("__offset") * F.lit(w.slide_ms * 1000)
            end = start + F.lit(w.size_ms * 1000)
        assigned = rows.withColumn(WINDOW_START, F.timestamp_micros(start)).withColumn(
            WINDOW_END, F.timestamp_micros(end)
        )
        return assigned.where(F.col(TS_US) < F.unix_micros(WINDOW_END)).drop(*EVENT_TIME_COLUMNS, "__offset")

    def _latest_end(self) -> Column:
        """The end (µs) of the last window a row belongs to."""
        from pyspark.sql import functions as F

        ts, w = F.col(TS_US), self.window
        if w.kind == "session":
            return ts + F.lit(w.gap_ms * 1000)
        return ts - F.pmod(ts, F.lit(w.slide_ms * 1000)) + F.lit(w.size_ms * 1000)

    def _late(self, end_us: Column, before: WatermarkProgress) -> Column:
        """A window ending at ``end_us`` was closed by the watermark ``before`` this checkpoint."""
        from pyspark.sql import functions as F

        if before.watermark is None:
            return F.lit(False)
        return end_us + F.lit(self.lateness_ms * 1000) <= F.lit(before.watermark * 1000)

    def _closes(self, after: WatermarkProgress) -> Column:
        from pyspark.sql import functions as F

        return self._late(F.unix_micros(WINDOW_END), after)

    def _sessions(self, state: DataFrame, rows: DataFrame) -> tuple[DataFrame, DataFrame]:
        """The open sessions and the new rows' sessions, each relabelled with the bounds of the session
        it merges into: sessions of a key that overlap or touch (a start at most the greatest end before
        it) are one, whether they come from state or from this checkpoint."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        spans = [*self.group_keys, WINDOW_START, WINDOW_END]
        tagged = state.select(*spans, F.struct(*state.columns).alias("__state")).unionByName(
            rows.select(*spans, F.struct(*rows.columns).alias("__row")), allowMissingColumns=True
        )
        order = Window.partitionBy(*self.group_keys).orderBy(WINDOW_START, WINDOW_END)
        before = F.max(WINDOW_END).over(order.rowsBetween(Window.unboundedPreceding, -1))
        opens = (before.isNull() | (F.col(WINDOW_START) > before)).cast("long")
        numbered = tagged.withColumn("__session", F.sum(opens).over(order.rowsBetween(Window.unboundedPreceding, 0)))
        same = Window.partitionBy(*self.group_keys, "__session")
        merged = (
            numbered.withColumn(WINDOW_START, F.min(WINDOW_START).over(same))
            .withColumn(WINDOW_END, F.max(WINDOW_END).over(same))
            .persist()  # split in two below
        )

        def side(struct: str, columns: list[str]) -> DataFrame:
            bounds = (WINDOW_START, WINDOW_END)
            return merged.where(F.col(struct).isNotNull()).select(
                *[F.col(c) if c in bounds else F.col(f"{struct}.{c}").alias(c) for c in columns]
            )

        return side("__state", state.columns), side("__row", rows.columns)


class LateRows(Protocol):
    """An operator with ``late="output"``: its late rows of the checkpoint it last ran."""

    uid: str

    def late_rows(self) -> DataFrame: ...


class LateData(Transform):
    """The late rows of an operator with ``late="output"`` (a :class:`WindowAggregate`'s or a
    :class:`~.dedup.Deduplicate`'s ``late_data``), per checkpoint: an input of sinks, run in the
    operator's step after it."""

    def __init__(self, operator: LateRows) -> None:
        assert isinstance(operator, Node)
        super().__init__(f"{operator.uid}.late", operator, lambda _: operator.late_rows())
