"""Stateful operators: a built-in keyed aggregate and user-defined keyed state functions."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.core.model import Barrier
from airflow_provider_checkpoint.dataflow.graph import CHANGED, DELETED, NEW, Node, StatefulOperator
from airflow_provider_checkpoint.dataflow.keyed_join import OTHER, keys_match, other_side
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

_AGG = re.compile(r"^\s*(count|sum|min|max)\s*(?:\(\s*([A-Za-z_][A-Za-z0-9_]*|\*)?\s*\))?\s*$")


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

    ``aggs`` maps an output column to ``count``, ``sum(col)``, ``min(col)`` or ``max(col)``.
    The state holds one row per key with those columns (a null key is a key too); the
    output holds the new values of the keys that changed in this checkpoint (suited to an
    upsert sink). Incremental checkpoints write only the state of those keys.

    The input is read once, in the checkpoint's first Spark action: its rows are aggregated
    together with the state's (one shuffle), or, in an incremental checkpoint over more than
    :data:`SHUFFLE_MERGE_ROWS` rows of state, aggregated and cached, then merged with the
    state of its keys only (or, for an increment with keys for :data:`BIG_INCREMENT_SHARE` of
    the state, aggregated together with the whole state). A source feeding only this operator
    is read in one pass.
    """

    reads_input_once = True

    def __init__(
        self,
        uid: str,
        input: Node,
        keys: Sequence[str],
        aggs: Mapping[str, str],
        max_parallelism: int = 128,
    ) -> None:
        super().__init__(uid, input, keys, max_parallelism)
        if not aggs:
            raise PipelineDefinitionError(f"{uid}: aggs must name at least one aggregate")
        self.aggs: dict[str, tuple[str, str | None]] = {}
        for out, spec in aggs.items():
            m = _AGG.match(spec)
            if not m or (m.group(1) != "count" and m.group(2) in (None, "*")):
                raise PipelineDefinitionError(
                    f"{uid}: aggregate {out}={spec!r} is not one of count, sum(col), min(col), max(col)"
                )
            if out in keys:
                raise PipelineDefinitionError(f"{uid}: aggregate column {out!r} clashes with a key")
            self.aggs[out] = (m.group(1), None if m.group(2) in (None, "*") else m.group(2))

    def unique_keys(self) -> tuple[str, ...]:
        """The output holds one row per changed key."""
        return self.keys

    def input_columns(self) -> tuple[str, ...]:
        """The input columns the aggregates read, each once, in the order of ``aggs``."""
        return tuple(dict.fromkeys(col for _, col in self.aggs.values() if col is not None))

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "aggs": {k: f"{f}({c or '*'})" for k, (f, c) in self.aggs.items()}}

    def _partial(self, input: DataFrame, *by: str) -> DataFrame:
        """The aggregates of ``input`` per key (grouped by the columns ``by`` too)."""
        from pyspark.sql import functions as F

        exprs: list[Column] = []
        for out, (fn, col) in self.aggs.items():
            if col is None:
                exprs.append(F.count(F.lit(1)).alias(out))
            else:
                exprs.append(getattr(F, fn)(F.col(col)).alias(out))
        return input.groupBy(*by, *self.keys).agg(*exprs)

    def initial_state(self, spark: SparkSession, inputs: Mapping[str, DataFrame]) -> DataFrame:
        return spark.createDataFrame([], self._partial(inputs[self.inputs[0].uid]).schema)

    def first_state(self, inputs: Mapping[str, DataFrame], range_column: Column, name: str, ranges: int) -> DataFrame:
        """The input's aggregates per key, the input's rows shuffled once by range (no partial
        aggregation before the shuffle: the output of a first checkpoint is every key, one row each)."""
        input = inputs[self.inputs[0].uid].withColumn(name, range_column)
        return self._partial(input.repartitionById(ranges, name), name)

    def apply(self, input: DataFrame, state: DataFrame) -> tuple[DataFrame, DataFrame]:
        """Every key's new state from one aggregation of the input with the state; the output
        is the new rows of the keys in the input."""
        merged = self._aggregated_with(state, input).persist()  # used twice: the input is read once
        return merged.drop("__touched", NEW), merged.where("__touched").drop("__touched", NEW)

    def changes(
        self, inputs: Mapping[str, DataFrame], state: DataFrame, barrier: Barrier, state_rows: int
    ) -> DataFrame:
        """Only the state of the keys in this checkpoint's input is merged.

        A state of at most :data:`SHUFFLE_MERGE_ROWS` rows is merged in the aggregation
        itself: input rows and state rows are aggregated together (one shuffle, one pass
        over the input), and the changelog lists every key, ``__changed`` marking those in
        the input. A larger state is semi-joined with the keys of the input's per-key
        aggregates (cached: one pass over the input), so that only the touched keys are
        shuffled; unless those keys are at least :data:`BIG_INCREMENT_SHARE` of the state's
        rows: then the aggregates are aggregated together with the state, as above.
        """
        from pyspark.sql import functions as F

        input, partial = inputs[self.inputs[0].uid], False
        if state_rows > SHUFFLE_MERGE_ROWS:
            batch = self._partial(input).persist()  # used twice: the input is read once
            if batch.count() < BIG_INCREMENT_SHARE * state_rows:
                touched = state.join(other_side(batch.select(*self.keys)), keys_match(self.keys), "left_semi")
                return self._merged(touched, batch).withColumn(DELETED, F.lit(False))
            input, partial = batch, True
        merged = self._aggregated_with(state, input, partial)
        return merged.select(
            *self.keys, *self.aggs, F.lit(False).alias(DELETED), NEW, F.col("__touched").alias(CHANGED)
        )

    def partials(self, inputs: Mapping[str, DataFrame]) -> DataFrame:
        """The input's aggregates per key (one row per key in the input)."""
        return self._partial(inputs[self.inputs[0].uid])

    def merge_arrow(self, state: pa.Table, partials: pa.Table) -> pa.Table:
        """The keys of ``partials`` with their aggregates combined with their ``state`` rows, as
        :meth:`_aggregated_with` combines them (a null key is a key too), in pyarrow."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        columns = [*self.keys, *self.aggs]
        extra = [c for c in partials.column_names if c not in columns]
        target = state.select(columns).schema
        keys = partials.select(list(self.keys)).cast(state.select(list(self.keys)).schema)
        state = state.select(columns)
        if not any(keys[k].null_count for k in self.keys):  # else group all: joins never match null keys
            state = state.join(keys, list(self.keys), join_type="left semi", use_threads=False)
        old = state.append_column("__input", pa.array(np.zeros(len(state), np.int8)))
        for c in extra:
            old = old.append_column(c, pa.nulls(len(state), partials.schema.field(c).type))
        new = partials.select(columns).cast(target).append_column("__input", pa.array(np.ones(len(partials), np.int8)))
        for c in extra:
            new = new.append_column(c, partials[c])
        combine = {"count": "sum", "sum": "sum", "min": "min", "max": "max"}
        grouped = (
            pa.concat_tables([old, new])
            .group_by(list(self.keys), use_threads=False)
            .aggregate(
                [(out, combine[fn]) for out, (fn, _) in self.aggs.items()]
                + [("__input", "max"), ("__input", "min")]
                + [(c, "max") for c in extra]
            )
        )
        touched = grouped.filter(pc.equal(grouped["__input_max"], 1))
        return pa.table(
            {
                **{k: touched[k] for k in self.keys},
                **{
                    out: touched[f"{out}_{combine[fn]}"].cast(target.field(out).type)
                    for out, (fn, _) in self.aggs.items()
                },
                NEW: pc.equal(touched["__input_min"], 1),
                **{c: touched[f"{c}_max"] for c in extra},
            }
        )

    def _aggregated_with(self, state: DataFrame, input: DataFrame, partial: bool = False) -> DataFrame:
        """Every key of ``state`` and ``input`` with its new aggregates, from one aggregation of
        the input's rows (``partial``: its per-key aggregates, :meth:`_partial`) and the state's;
        ``__touched`` marks keys in the input, ``__new`` keys without a state row."""
        from pyspark.sql import functions as F

        def value(out: str, fn: str, col: str | None) -> Column:
            """A row's contribution: what the aggregate of this row alone would be."""
            if partial:  # already the aggregate of the key's rows, combined as the state's is
                return F.col(out)
            if col is None:  # count(*)
                return F.lit(1)
            return F.col(col).isNotNull().cast("long") if fn == "count" else F.col(col)

        rows = input.select(
            *self.keys,
            *[value(out, fn, col).alias(out) for out, (fn, col) in self.aggs.items()],
            F.lit(True).alias("__input"),
        )
        combine = {"count": F.sum, "sum": F.sum, "min": F.min, "max": F.max}
        types = {f.name: f.dataType for f in state.schema.fields}
        return (
            rows.unionByName(state.withColumn("__input", F.lit(False)))
            .groupBy(*self.keys)
            .agg(
                *[combine[fn](F.col(out)).cast(types[out]).alias(out) for out, (fn, _) in self.aggs.items()],
                F.max("__input").alias("__touched"),
                F.min("__input").alias(NEW),
            )
        )

    def _merged(self, state: DataFrame, batch: DataFrame) -> DataFrame:
        """Every key of the batch, its aggregates combined with its state's; ``__new`` marks keys without state."""
        from pyspark.sql import functions as F

        joined = state.withColumn("__had_state", F.lit(True)).join(other_side(batch), keys_match(self.keys), "right")
        merged: list[Column] = [F.coalesce(F.col(k), F.col(OTHER + k)).alias(k) for k in self.keys]
        for out, (fn, _) in self.aggs.items():
            old, new = F.col(out), F.col(OTHER + out)
            if fn in ("count", "sum"):
                value = F.when(old.isNull(), new).when(new.isNull(), old).otherwise(old + new)
            elif fn == "min":
                value = F.least(old, new)
            else:
                value = F.greatest(old, new)
            merged.append(value.cast(batch.schema[out].dataType).alias(out))
        return joined.select(*merged, F.col("__had_state").isNull().alias(NEW))
