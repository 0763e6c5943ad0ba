"""Stateful operators: a built-in keyed aggregate and user-defined keyed state functions."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.core.event_time import WatermarkProgress, WatermarkSpec
from airflow_provider_checkpoint.core.model import Barrier
from airflow_provider_checkpoint.core.ttl import EXPIRES_AT, TTL, Clocks
from airflow_provider_checkpoint.dataflow.aggregates import (
    ARROW_COMBINE,
    DRIVER_PARTIALS,
    Aggregate,
    key_order,
    partials_arrow,
)
from airflow_provider_checkpoint.dataflow.expiry import TS_MS_UP, advance, live_state, with_event_time
from airflow_provider_checkpoint.dataflow.graph import Node
from airflow_provider_checkpoint.dataflow.keyed_join import OTHER, keys_match, other_side
from airflow_provider_checkpoint.dataflow.operator import CHANGED, DELETED, NEW, StatefulOperator
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession

StateFunction = Callable[["DataFrame", "DataFrame"], "tuple[DataFrame, DataFrame]"]

SHUFFLE_MERGE_ROWS = 250_000
"""A :class:`KeyedAggregate` state of at most this many rows is merged with an increment in one
aggregation (the whole state shuffled once); a larger one is semi-joined with the increment's keys,
unless the increment is big (:data:`BIG_INCREMENT_SHARE`)."""
BIG_INCREMENT_SHARE = 0.1
"""An increment with keys for at least this share of a large state's rows is merged with the state in
one aggregation too: the semi-join would shuffle the whole state anyway (its keys are too many to
broadcast), and the changelog then lists every key, so a checkpoint changing most keys writes a full version."""


class KeyedStateFunction(StatefulOperator):
    """A user-defined stateful operator: ``fn(input, state) -> (new_state, output)``.

    ``state`` is a DataFrame with ``state_schema`` (a Spark DDL string) holding every key's
    state at the restore point, empty on the first run. ``new_state`` must contain the
    ``keys`` columns, at most one row per key, and replaces the whole state (a checkpoint
    writes only the keys whose row changed); ``output`` flows to downstream nodes.
    The function must be deterministic: a retried step must produce the same result.
    """

    def __init__(
        self,
        uid: str,
        input: Node,
        keys: Sequence[str],
        fn: StateFunction,
        state_schema: str,
        max_parallelism: int = 128,
    ) -> None:
        super().__init__(uid, input, keys, max_parallelism)
        self.fn = fn
        self.state_schema = state_schema

    def initial_state(self, spark: SparkSession, inputs: Mapping[str, DataFrame]) -> DataFrame:
        return spark.createDataFrame([], self.state_schema)

    def apply(self, input: DataFrame, state: DataFrame) -> tuple[DataFrame, DataFrame]:
        return self.fn(input, state)


class KeyedAggregate(StatefulOperator):
    """Running aggregates per key, merged with the state of the restore point.

    ``aggs`` maps an output column to a spec (:data:`~.aggregates.FORMS`: ``count``, ``sum(col)``,
    ``avg(col)``, ``approx_count_distinct(col)``, ``first(col, by)``, ``max_by(col, ord)``,
    ``collect_set(col, max_size)``...; :mod:`~.aggregates` defines each one's state and merge). The
    state holds one row per key: the key columns and every aggregate's state columns (a null key
    is a key too); the output holds the key columns and the aggregates' values, for the keys that
    changed in this checkpoint (suited to an upsert sink): hidden state columns (``__<out>__<part>``)
    never reach it. Incremental checkpoints write only the state of those keys.

    The input is read once, in the checkpoint's first Spark action: its rows are aggregated
    together with the state's (one shuffle), or, in an incremental checkpoint over more than
    :data:`SHUFFLE_MERGE_ROWS` rows of state, aggregated and cached, then merged with the
    state of its keys only (or, for an increment with keys for :data:`BIG_INCREMENT_SHARE` of
    the state, aggregated together with the whole state). A source feeding only this operator
    is read in one pass.

    ``ttl="1 day"`` or ``ttl=TTL("1 day", time=..., update=...)`` (:class:`~.core.ttl.TTL`): a key's
    state expires that long after the trigger time of the last checkpoint with rows for it
    (``time="processing"``), or once the watermark passes the greatest event time of its rows plus the
    duration (``time="event"``; the watermark is ``watermark=(time_column, bound)``, else the one
    declared on the sources upstream; rows without event time are dropped and counted). ``update``:
    ``"on_write"`` or ``"on_read_and_write"`` give the same here (state is read only to be written).
    Expired state is never read back: a key with new rows restarts from empty, and its output row
    holds the aggregates of the rows since. The expiry is the hidden state column
    ``__expires_at``; a checkpoint removes every key expired at its clock, and the next compaction
    of the key's range drops it from the files. Such a checkpoint merges in Spark (no driver merge).
    """

    reads_input_once = True

    def __init__(
        self,
        uid: str,
        input: Node,
        keys: Sequence[str],
        aggs: Mapping[str, str],
        max_parallelism: int = 128,
        ttl: TTL | str | None = None,
        watermark: tuple[str, str] | None = None,
    ) -> None:
        super().__init__(uid, input, keys, max_parallelism)
        self.ttl = None if ttl is None else TTL.of(ttl, uid)
        self.ttl_watermark: WatermarkSpec | None = None
        if self.ttl is not None and self.ttl.time == "event":
            self.ttl_watermark = self.own_watermark(watermark, "an event-time TTL")
            self.reads_input_once = False  # read twice: for the watermark, then for the aggregates
        elif watermark is not None:
            raise PipelineDefinitionError(
                f"{uid}: watermark= is used by an event-time TTL only; "
                "give ttl=TTL(..., time='event') or remove watermark"
            )
        if not aggs:
            raise PipelineDefinitionError(f"{uid}: aggs must name at least one aggregate")
        self.aggs: dict[str, Aggregate] = {}
        for out, spec in aggs.items():
            self.aggs[out] = Aggregate.parse(uid, out, spec)
            if out in keys:
                raise PipelineDefinitionError(f"{uid}: aggregate column {out!r} clashes with a key")
        self._state_columns = [c for agg in self.aggs.values() for c in agg.state_columns()]

    def unique_keys(self) -> tuple[str, ...]:
        """The output holds one row per changed key."""
        return self.keys

    def input_columns(self) -> tuple[str, ...]:
        """The input columns the aggregates read (both of a two-column form), each once, in the order of ``aggs``."""
        return tuple(dict.fromkeys(c for agg in self.aggs.values() for c in agg.input_columns()))

    def describe(self) -> dict[str, object]:
        described = {**super().describe(), "aggs": {k: agg.spec() for k, agg in self.aggs.items()}}
        if self.ttl is not None:
            described["ttl"] = self.ttl.describe()
        if self.ttl_watermark is not None:
            described["watermark"] = [self.ttl_watermark.column, self.ttl_watermark.bound_ms]
        return described

    def state_declaration(self) -> dict[str, str]:
        """Each aggregate's spec (its state columns' meaning) and the clock of the TTL (its expiry times')."""
        return {
            **{f"aggregate {out}": agg.spec() for out, agg in self.aggs.items()},
            "ttl": "none" if self.ttl is None else f"by {self.ttl.time} time",
        }

    def _partial(self, input: DataFrame, *by: str) -> DataFrame:
        """The state columns of ``input``'s rows per key (grouped by the columns ``by`` too)."""
        return input.groupBy(*by, *self.keys).agg(*[e for agg in self.aggs.values() for e in agg.partial()])

    def output_of(self, state: DataFrame) -> DataFrame:
        """The keys and the aggregates' values of ``state`` rows (no hidden state column)."""
        if all(agg.state_columns() == (out,) for out, agg in self.aggs.items()):
            return state
        return state.select(*self.keys, *[agg.output() for agg in self.aggs.values()])

    def output_arrow(self, state: pa.Table) -> pa.Table | None:
        """:meth:`output_of` in pyarrow, where it gives the same values (``None`` elsewhere)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        columns: dict[str, object] = {k: state[k] for k in self.keys}
        for out, agg in self.aggs.items():
            if agg.fn == "avg":
                total, count = (state[c] for c in agg.state_columns())
                if not pa.types.is_floating(total.type) and not pa.types.is_integer(total.type):
                    return None  # Spark divides decimals with its own precision and rounding
                columns[out] = pc.if_else(pc.greater(count, 0), pc.divide(pc.cast(total, "float64"), count), None)
            else:
                columns[out] = state[out]
        return pa.table(columns)

    def initial_state(self, spark: SparkSession, inputs: Mapping[str, DataFrame]) -> DataFrame:
        from pyspark.sql import functions as F

        state = self._partial(inputs[self.inputs[0].uid])
        if self.ttl is not None:
            state = state.withColumn(EXPIRES_AT, F.lit(None).cast("long"))
        return spark.createDataFrame([], state.schema)

    # -- state that expires (ttl=): the forms below (changes, partials, first_state) know no expiry
    def process(
        self, inputs: Mapping[str, DataFrame], state: DataFrame, barrier: Barrier
    ) -> tuple[DataFrame, DataFrame]:
        if self.ttl is None:
            return super().process(inputs, state, barrier)
        from pyspark.sql import functions as F

        clocks = Clocks.of_checkpoint(barrier.trigger_time)
        return self._expiring(inputs[self.inputs[0].uid], state, clocks, F.lit(clocks.processing))

    def event_time(
        self, inputs: Mapping[str, DataFrame], before: WatermarkProgress, barrier: Barrier
    ) -> tuple[WatermarkProgress, dict[str, int]] | None:
        """With an event-time TTL: one pass over the input for its greatest event time and its rows without one."""
        if self.ttl_watermark is None:
            return None
        spec = self.ttl_watermark
        rows = with_event_time(inputs[self.inputs[0].uid], self.uid, spec.column, keep_nulls=True)
        return advance(rows, before, spec.bound_ms)

    def process_at(
        self,
        inputs: Mapping[str, DataFrame],
        state: DataFrame,
        barrier: Barrier,
        before: WatermarkProgress,
        after: WatermarkProgress,
    ) -> tuple[DataFrame, DataFrame]:
        from pyspark.sql import functions as F

        assert self.ttl_watermark is not None
        rows = with_event_time(inputs[self.inputs[0].uid], self.uid, self.ttl_watermark.column)
        return self._expiring(rows, state, Clocks.of_checkpoint(barrier.trigger_time, before, after), F.col(TS_MS_UP))

    def _expiring(
        self, input: DataFrame, state: DataFrame, clocks: Clocks, stamp: Column
    ) -> tuple[DataFrame, DataFrame]:
        """The new state and output with expiry: state live at its read clock merged with the input, each
        touched key's expiry renewed from its rows' ``stamp`` (ms), and only keys live at its keep clock kept."""
        from pyspark.sql import functions as F

        assert self.ttl is not None
        if EXPIRES_AT not in state.columns:
            raise PipelineDefinitionError(
                f"{self.uid}: its state was written without ttl, so it has no expiry times; give the operator "
                "a new uid to start with ttl (restore with allow_non_restored_state to drop the old state)"
            )
        input = input.withColumn(EXPIRES_AT, stamp + F.lit(self.ttl.ms))
        merged = self._aggregated_with(live_state(state, clocks.read(self.ttl.time)), input).persist()  # used twice
        changed = merged.where("__touched").drop("__touched", NEW, EXPIRES_AT)
        return live_state(merged, clocks.keep(self.ttl.time)).drop("__touched", NEW), self.output_of(changed)

    def first_state(
        self, inputs: Mapping[str, DataFrame], range_column: Column, name: str, ranges: int
    ) -> DataFrame | None:
        """The input's aggregates per key, the input's rows shuffled once by range (no partial
        aggregation before the shuffle: the output of a first checkpoint is every key, one row each)."""
        if self.ttl is not None:
            return None
        input = inputs[self.inputs[0].uid].withColumn(name, range_column)
        return self._partial(input.repartitionById(ranges, name), name)

    def apply(self, input: DataFrame, state: DataFrame) -> tuple[DataFrame, DataFrame]:
        """Every key's new state from one aggregation of the input with the state; the output
        is the new rows of the keys in the input."""
        merged = self._aggregated_with(state, input).persist()  # used twice: the input is read once
        changed = merged.where("__touched").drop("__touched", NEW)
        return merged.drop("__touched", NEW), self.output_of(changed)

    def changes(
        self, inputs: Mapping[str, DataFrame], state: DataFrame, barrier: Barrier, state_rows: int
    ) -> DataFrame | None:
        """Only the state of the keys in this checkpoint's input is merged.

        A state of at most :data:`SHUFFLE_MERGE_ROWS` rows is merged in the aggregation
        itself: input rows and state rows are aggregated together (one shuffle, one pass
        over the input), and the changelog lists every key, ``__changed`` marking those in
        the input. A larger state is semi-joined with the keys of the input's per-key
        aggregates (cached: one pass over the input), so that only the touched keys are
        shuffled; unless those keys are at least :data:`BIG_INCREMENT_SHARE` of the state's
        rows: then the aggregates are aggregated together with the state, as above. With ``ttl``:
        ``None`` (expiry removes keys the input never names: the checkpoint diffs the new state).
        """
        from pyspark.sql import functions as F

        if self.ttl is not None:
            return None
        input, partial = inputs[self.inputs[0].uid], False
        if state_rows > SHUFFLE_MERGE_ROWS:
            batch = self._partial(input).persist()  # used twice: the input is read once
            if batch.count() < BIG_INCREMENT_SHARE * state_rows:
                touched = state.join(other_side(batch.select(*self.keys)), keys_match(self.keys), "left_semi")
                return self._merged(touched, batch).withColumn(DELETED, F.lit(False))
            input, partial = batch, True
        merged = self._aggregated_with(state, input, partial)
        return merged.select(
            *self.keys, *self._state_columns, F.lit(False).alias(DELETED), NEW, F.col("__touched").alias(CHANGED)
        )

    def partials(self, inputs: Mapping[str, DataFrame]) -> DataFrame | None:
        """The input's aggregates per key (one row per key in the input); ``None`` when an aggregate's
        state is merged by Spark only (a sketch, a set)."""
        if self.ttl is not None or not all(agg.arrow_mergeable() for agg in self.aggs.values()):
            return None
        return self._partial(inputs[self.inputs[0].uid])

    def takes_source_rows(self) -> bool:
        """Without ``ttl``, when every aggregate is one :func:`~.aggregates.partials_arrow` computes."""
        return self.ttl is None and all(agg.fn in DRIVER_PARTIALS for agg in self.aggs.values())

    def partials_arrow(self, rows: pa.Table) -> pa.Table | None:
        """:meth:`partials` in pyarrow (:func:`~.aggregates.partials_arrow`: counts, minima and maxima)."""
        return None if self.ttl is not None else partials_arrow(self.aggs, self.keys, rows)

    def merge_arrow(self, state: pa.Table, partials: pa.Table) -> pa.Table:
        """The keys of ``partials`` with their aggregates combined with their ``state`` rows, as
        :meth:`_aggregated_with` combines them (a null key is a key too), in pyarrow."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        keys = list(self.keys)
        columns = [*keys, *self._state_columns]
        extra = [c for c in partials.column_names if c not in columns]
        target = state.select(columns).schema
        state = state.select(columns)
        if not any(partials[k].null_count for k in keys):  # else group all: joins never match null keys
            state = state.join(partials.select(keys).cast(state.select(keys).schema), keys, join_type="left semi")
        old = state.append_column("__input", pa.array(np.zeros(len(state), np.int8)))
        for c in extra:
            old = old.append_column(c, pa.nulls(len(state), partials.schema.field(c).type))
        new = partials.select(columns).cast(target).append_column("__input", pa.array(np.ones(len(partials), np.int8)))
        for c in extra:
            new = new.append_column(c, partials[c])
        rows, starts = key_order(pa.concat_tables([old, new]), keys)
        simple = [
            (c, ARROW_COMBINE[agg.fn])
            for agg in self.aggs.values()
            if agg.fn in ARROW_COMBINE
            for c in agg.state_columns()
        ]
        grouped = rows.group_by(keys, use_threads=False).aggregate(
            [*simple, ("__input", "max"), ("__input", "min"), *[(c, "max") for c in extra]]
        )
        grouped, _ = key_order(grouped, keys)  # one row per key, in the order of ``starts``
        combined = {c: grouped[f"{c}_{fn}"] for c, fn in simple}
        for agg in self.aggs.values():
            if agg.fn not in ARROW_COMBINE:
                combined.update(agg.combine_arrow(rows, keys, starts))
        touched = pc.equal(grouped["__input_max"], 1)
        return pa.table(
            {
                **{k: grouped[k] for k in keys},
                **{c: combined[c].cast(target.field(c).type) for c in self._state_columns},
                NEW: pc.equal(grouped["__input_min"], 1),
                **{c: grouped[f"{c}_max"] for c in extra},
            }
        ).filter(touched)

    def _aggregated_with(
        self, state: DataFrame, input: DataFrame, partial: bool = False, extra: Mapping[str, Column] | None = None
    ) -> DataFrame:
        """Every key of ``state`` and ``input`` with its new state, from one aggregation of the input's
        rows (``partial``: its per-key aggregates, :meth:`_partial`) and the state's rows, each
        aggregate combining them (:meth:`Aggregate.combine`); ``__touched`` marks keys in the input,
        ``__new`` keys without a state row; ``extra``: more aggregates by name, as the last columns."""
        from pyspark.sql import functions as F

        types = {f.name: f.dataType for f in state.schema.fields}
        extra = extra or {}
        expires = [EXPIRES_AT] if self.ttl is not None else []
        if partial:  # already in state form, combined as the state's rows are
            no_raw = [c for agg in self.aggs.values() for c in agg.no_raw(types)]
            rows = input.select(*self.keys, *self._state_columns, *no_raw, F.lit(True).alias("__input"))
        else:  # with ttl, the input carries each row's expiry (:meth:`_expiring`)
            rows = input.select(
                *self.keys,
                *[c for agg in self.aggs.values() for c in agg.row()],
                *expires,
                F.lit(True).alias("__input"),
            )
        combines = [agg.combine(types) for agg in self.aggs.values()]
        return (
            rows.unionByName(state.withColumn("__input", F.lit(False)), allowMissingColumns=True)
            .groupBy(*self.keys)
            .agg(
                *[a for aggs, _ in combines for a in aggs],
                F.max("__input").alias("__touched"),
                F.min("__input").alias(NEW),
                *[F.max(c).cast("long").alias(c) for c in expires],
                *[e.alias(name) for name, e in extra.items()],
            )
            .select(
                *self.keys,
                *[f for _, finals in combines for f in finals],
                *expires,
                "__touched",
                NEW,
                *extra,
            )
        )

    def _merged(self, state: DataFrame, batch: DataFrame) -> DataFrame:
        """Every key of the batch, its aggregates combined with its state's; ``__new`` marks keys without state."""
        from pyspark.sql import functions as F

        joined = state.withColumn("__had_state", F.lit(True)).join(other_side(batch), keys_match(self.keys), "right")
        merged: list[Column] = [F.coalesce(F.col(k), F.col(OTHER + k)).alias(k) for k in self.keys]
        for agg in self.aggs.values():
            cols = agg.state_columns()
            values = agg.merged({c: F.col(c) for c in cols}, {c: F.col(OTHER + c) for c in cols})
            merged += [v.cast(batch.schema[c].dataType).alias(c) for v, c in zip(values, cols, strict=True)]
        return joined.select(*merged, F.col("__had_state").isNull().alias(NEW))
