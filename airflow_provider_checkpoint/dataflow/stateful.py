"""Stateful operators: a built-in keyed aggregate and user-defined keyed state functions."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.dataflow.graph import Node, PipelineDefinitionError, StatefulOperator

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
    The state holds one row per key with those columns; the output holds the new values
    of the keys that changed in this checkpoint (suited to an upsert sink).
    """

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
        from pyspark.sql import functions as F

        batch = self._partial(input)
        joined = state.alias("s").join(batch.alias("b"), list(self.keys), "full_outer")
        merged: list[Column] = [F.col(k) for k in self.keys]
        for out, (fn, _) in self.aggs.items():
            s, b = F.col(f"s.{out}"), F.col(f"b.{out}")
            if fn in ("count", "sum"):
                value = F.when(s.isNull(), b).when(b.isNull(), s).otherwise(s + b)
            elif fn == "min":
                value = F.least(s, b)
            else:
                value = F.greatest(s, b)
            merged.append(value.cast(batch.schema[out].dataType).alias(out))
        new_state = joined.select(*merged)
        output = new_state.join(batch.select(*self.keys), list(self.keys), "left_semi")
        return new_state, output
