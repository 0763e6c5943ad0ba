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
from functools import reduce
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.core.event_time import WatermarkProgress, WatermarkSpec, combine, duration_ms
from airflow_provider_checkpoint.core.model import Barrier
from airflow_provider_checkpoint.dataflow.expiry import (
    EVENT_TIME_COLUMNS,
    TS_MS_UP,
    TS_US,
    observe_each,
    with_event_time,
)
from airflow_provider_checkpoint.dataflow.graph import Node, Union
from airflow_provider_checkpoint.dataflow.keyed_join import OTHER, keys_match, other_side
from airflow_provider_checkpoint.dataflow.late_data import LateOutput
from airflow_provider_checkpoint.dataflow.operator import CHANGED, DELETED, NEW, Ranges
from airflow_provider_checkpoint.dataflow.session_merge import merge_session_windows
from airflow_provider_checkpoint.dataflow.sessions import WINDOW_END, WINDOW_START, merge_sessions
from airflow_provider_checkpoint.dataflow.stateful import KeyedAggregate
from airflow_provider_checkpoint.dataflow.window_kinds import Windows
from airflow_provider_checkpoint.dataflow.window_merge import merge_windows
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession


class WindowAggregate(LateOutput, KeyedAggregate):
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
        self.reads_input_once = len(self.bounds) == 1  # event_time's one pass caches what the windows read
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
        self._cached: tuple[Mapping[str, DataFrame], DataFrame] | None = None  # event_time's pass, by its inputs
        self.group_keys = tuple(keys)
        self.time_column, self.window, self.emit = time_column, window, emit
        self.moves_keys = window.kind == "session"  # a session's bounds (its key) grow as it merges
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

    def state_declaration(self) -> dict[str, str]:
        """The aggregates' and the windows': a window in state is only one of this size (or gap)."""
        return {**super().state_declaration(), "window": self.window.describe()}

    def initial_state(self, spark: SparkSession, inputs: Mapping[str, DataFrame]) -> DataFrame:
        return spark.createDataFrame([], self._partial(self._assigned(self._timed(inputs[self.inputs[0].uid]))).schema)

    def event_time(
        self, inputs: Mapping[str, DataFrame], before: WatermarkProgress, barrier: Barrier
    ) -> tuple[WatermarkProgress, dict[str, int]]:
        """One pass over the input (over a union, over each of its inputs, in one job), which caches the
        rows the windows need: the greatest event time of each input, the late rows and the rows
        without event time."""
        rows = self._increment(inputs)
        seen = observe_each(rows, "__member", self._late(self._latest_end(), before))
        self._cached = (inputs, rows)
        counted = "late_rows_output" if self.late == "output" else "late_rows_dropped"
        metrics = {
            counted: sum(s.late for s in seen.values()),
            "rows_without_event_time": sum(s.untimed for s in seen.values()),
        }
        tops = {uid: seen[i].top if i in seen else None for i, uid in enumerate(self.bounds)}
        if len(self.bounds) == 1:
            ((uid, bound),) = self.bounds.items()
            return before.advance(tops[uid], bound), metrics
        now = round(barrier.trigger_time * 1000)
        return combine(before, tops, self.bounds, now, self.idle_after_ms), metrics

    def _increment(self, inputs: Mapping[str, DataFrame]) -> DataFrame:
        """The rows of each input with a watermark (the inputs of a union, else the input), each tagged
        with its index (``__member``) and its event time (nulls kept), in one cached DataFrame: only the
        columns the windows read, unless the late rows are an output (all)."""
        from pyspark.sql import functions as F

        tagged = [
            self._timed(inputs[uid], keep_nulls=True).drop(TS_MS_UP).withColumn("__member", F.lit(i))
            for i, uid in enumerate(self.bounds)
        ]
        rows = reduce(lambda a, b: a.unionByName(b), tagged)
        if self.late != "output":
            rows = rows.select(*dict.fromkeys([*self.group_keys, *self.input_columns()]), TS_US, "__member")
        return rows.persist()

    def _rows(self, inputs: Mapping[str, DataFrame]) -> DataFrame:
        """The input's rows with event time, cached by :meth:`event_time` (computed again for other inputs)."""
        from pyspark.sql import functions as F

        cached = self._cached
        rows = cached[1] if cached is not None and cached[0] is inputs else self._increment(inputs)
        return rows.where(F.col(TS_US).isNotNull()).drop("__member")

    def process_at(
        self,
        inputs: Mapping[str, DataFrame],
        state: DataFrame,
        barrier: Barrier,
        before: WatermarkProgress,
        after: WatermarkProgress,
    ) -> tuple[DataFrame, DataFrame]:
        step = self._step(inputs, state, before, after)
        kept = step.merged.where(~step.closed).drop("__touched", NEW, "__kept")
        if step.untouched is not None:
            kept = kept.unionByName(step.untouched.where(~step.closed))
        return kept.select(*state.columns), self._emitted(step, state.columns)

    def changes_at(
        self,
        inputs: Mapping[str, DataFrame],
        state: DataFrame,
        barrier: Barrier,
        before: WatermarkProgress,
        after: WatermarkProgress,
    ) -> tuple[DataFrame, DataFrame]:
        """Every open window and the output; ``__changed`` marks the windows with new rows and those
        closed (a window that opens and closes in this checkpoint is no change). Sessions: a state row of a
        key with new rows that moved (merged into a session with other bounds) is deleted too."""
        from pyspark.sql import functions as F

        step = self._step(inputs, state, before, after)
        output = self._emitted(step, state.columns)
        new, closed, touched, no = F.col(NEW), step.closed, F.col("__touched"), F.lit(False)
        if step.untouched is None:  # windows that never merge
            changed = (touched | closed) & ~(new & closed)
            return step.merged.select(*state.columns, closed.alias(DELETED), NEW, changed.alias(CHANGED)), output
        kept = F.coalesce(F.col("__kept"), no)
        changed = (touched & ~closed) | (closed & kept)
        changes = [
            step.merged.select(*state.columns, closed.alias(DELETED), (~kept).alias(NEW), changed.alias(CHANGED)),
            step.untouched.select(*state.columns, closed.alias(DELETED), no.alias(NEW), closed.alias(CHANGED)),
        ]
        if step.moved is not None:
            yes = F.lit(True)
            changes.append(step.moved.select(*state.columns, yes.alias(DELETED), no.alias(NEW), yes.alias(CHANGED)))
        return reduce(lambda a, b: a.unionByName(b), changes), output

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

    def _on_time(self, inputs: Mapping[str, DataFrame], before: WatermarkProgress) -> DataFrame:
        """The input's (row, window) pairs not late by the watermark ``before`` (the late rows kept aside
        as :attr:`late_data` with ``late="output"``)."""
        from pyspark.sql import functions as F

        timed = self._rows(inputs)
        if self.late == "output":
            self._late_rows = timed.where(self._late(self._latest_end(), before)).drop(TS_US)
        return self._assigned(timed).where(~self._late(F.unix_micros(WINDOW_END), before))

    def partials_at(self, inputs: Mapping[str, DataFrame], before: WatermarkProgress) -> DataFrame | None:
        """The aggregates of the on-time rows per window (a session: per row's own ``[ts, ts + gap)``)
        when pyarrow merges every aggregate."""
        if not all(agg.arrow_mergeable() for agg in self.aggs.values()):
            return None
        return self._partial(self._on_time(inputs, before))

    def merge_at_arrow(
        self, state: pa.Table, partials: pa.Table, after: WatermarkProgress, ranges: Ranges
    ) -> tuple[pa.Table, pa.Table]:
        """Windows merged as :func:`~.window_merge.merge_windows` says; sessions as
        :func:`~.session_merge.merge_session_windows` says."""
        if self.moves_keys:
            return merge_session_windows(
                self.merge_arrow, state, partials, self.group_keys, self.lateness_ms, after.watermark, ranges
            )
        return merge_windows(self.merge_arrow, state, partials, self.keys, self.lateness_ms, after.watermark, self.emit)

    def closes_below(self, after: WatermarkProgress) -> tuple[str, int | None]:
        """A window ending before the watermark less the allowed lateness (+1 µs) closes."""
        if after.watermark is None:
            return WINDOW_END, None
        return WINDOW_END, (after.watermark - self.lateness_ms) * 1000 + 1

    def _step(
        self, inputs: Mapping[str, DataFrame], state: DataFrame, before: WatermarkProgress, after: WatermarkProgress
    ) -> _Step:
        """The windows this checkpoint merges: the new rows' windows open ``before`` it, aggregated with
        their state. Sessions: only the keys with new rows are sessionized; the others' sessions are
        left as they are (:attr:`_Step.untouched`), to be closed by ``after`` alone."""
        from pyspark.sql import functions as F

        rows = self._on_time(inputs, before)
        closed = self._closes(after)
        if self.window.kind != "session":
            return _Step(self._aggregated_with(state, rows).persist(), closed)  # used twice
        if self.group_keys:
            hit = rows.select(*self.group_keys).distinct().withColumn("__hit", F.lit(True))
            marked = (
                state.join(other_side(hit), keys_match(self.group_keys), "left")
                .select(*state.columns, F.col(OTHER + "__hit").isNotNull().alias("__hit"))
                .persist()  # split in two below
            )
            touched, untouched = marked.where("__hit").drop("__hit"), marked.where(~F.col("__hit")).drop("__hit")
        else:  # one key: its sessions are all touched
            touched, untouched = state, state.where(F.lit(False))
        olds, rows = merge_sessions(self.group_keys, touched, rows)
        kept = {"__kept": F.max("__kept")}  # a session whose bounds a state row already had
        merged = self._aggregated_with(olds.drop("__old_start", "__old_end"), rows, extra=kept).persist()
        moved = (
            olds.where(~F.col("__kept"))
            .withColumn(WINDOW_START, F.col("__old_start"))
            .withColumn(WINDOW_END, F.col("__old_end"))
        )
        return _Step(merged, closed, untouched, moved)

    def _emitted(self, step: _Step, columns: Sequence[str]) -> DataFrame:
        """The output: the windows closed (``emit="final"``, sessions of untouched keys included) or touched."""
        from pyspark.sql import functions as F

        emitted = step.merged.where(step.closed if self.emit == "final" else F.col("__touched")).select(*columns)
        if step.untouched is not None:
            emitted = emitted.unionByName(step.untouched.where(step.closed).select(*columns))
        return self.output_of(emitted)


@dataclass(frozen=True)
class _Step:
    """The windows of one checkpoint (:meth:`WindowAggregate._step`): ``merged``, those of the keys with new
    rows aggregated with their state (``__touched``: with new rows; ``__new``: without a state row; sessions:
    ``__kept``, with a state row of the same bounds); ``closed`` tells those the watermark after it closes.
    Sessions: ``untouched``, the state's sessions of the other keys; ``moved``, state rows of touched keys
    merged into a session with other bounds (under their own)."""

    merged: DataFrame
    closed: Column
    untouched: DataFrame | None = None
    moved: DataFrame | None = None
