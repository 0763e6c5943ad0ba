"""Stateful operators: a built-in keyed aggregate and user-defined keyed state functions."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.core.model import Barrier
from airflow_provider_checkpoint.dataflow.graph import DELETED, NEW, Node, PipelineDefinitionError, StatefulOperator
from airflow_provider_checkpoint.spark.state import OTHER, keys_match, other_side

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

StateFunction = Callable[["DataFrame", "DataFrame"], "tuple[DataFrame, DataFrame]"]

_AGG = re.compile(r"^\s*(count|sum|min|max)\s*(?:\(\s*([A-Za-z_][A-Za-z0-9_]*|\*)?\s*\))?\s*$")


class KeyedStateFunction(StatefulOperator):
    """A user-defined stateful operator: ``fn(input, state) -> (new_state, output)``.

    ``state`` is a DataFrame with ``state_schema`` (a Spark DDL string) holding every key's
    state at the restore point, empty on the first run. ``new_state`` must contain the
    ``keys`` columns and replaces the whole state; ``output`` flows to downstream nodes.
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
    upsert sink). Incremental checkpoints read and merge only the state of those keys.

    The input is aggregated once, in the checkpoint's first Spark action, and the
    aggregate cached: a source feeding only this operator is read in one pass.
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

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "aggs": {k: f"{f}({c or '*'})" for k, (f, c) in self.aggs.items()}}

    def _partial(self, input: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        exprs: list[Column] = []
        for out, (fn, col) in self.aggs.items():
            if col is None:
                exprs.append(F.count(F.lit(1)).alias(out))
            else:
                exprs.append(getattr(F, fn)(F.col(col)).alias(out))
        return input.groupBy(*self.keys).agg(*exprs)

    def initial_state(self, spark: SparkSession, inputs: Mapping[str, DataFrame]) -> DataFrame:
        return spark.createDataFrame([], self._partial(inputs[self.inputs[0].uid]).schema)

    def apply(self, input: DataFrame, state: DataFrame) -> tuple[DataFrame, DataFrame]:
        batch = self._partial(input).persist()  # used twice: the input is read once
        new_state = self._merged(state, batch, "full_outer").drop(NEW)
        return new_state, new_state.join(other_side(batch), keys_match(self.keys), "left_semi")

    def changes(self, inputs: Mapping[str, DataFrame], state: DataFrame, barrier: Barrier) -> DataFrame:
        """Only the state of the keys in this checkpoint's input is read and merged."""
        from pyspark.sql import functions as F

        batch = self._partial(inputs[self.inputs[0].uid]).persist()  # used twice: the input is read once
        touched = state.join(other_side(batch.select(*self.keys)), keys_match(self.keys), "left_semi")
        return self._merged(touched, batch, "right").withColumn(DELETED, F.lit(False))

    def _merged(self, state: DataFrame, batch: DataFrame, how: str) -> DataFrame:
        """State and batch joined on the keys (``how``), aggregates combined; ``__new`` marks keys without state."""
        from pyspark.sql import functions as F

        joined = state.withColumn("__had_state", F.lit(True)).join(other_side(batch), keys_match(self.keys), how)
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
