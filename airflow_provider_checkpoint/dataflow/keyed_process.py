"""``KeyedProcess``: a user's :class:`~airflow_provider_checkpoint.core.keyed_process.KeyedProcessFunction`
run per key on the executors, with value, list and map state, event- and processing-time timers and TTL.

Per checkpoint the keys visited are those with rows in this checkpoint and those whose state needs
a visit without rows: a timer due, or an entry expired (a key's ``__wake_event`` at most the watermark
reached, or ``__wake_processing`` at most the trigger time). Their rows and state rows are
co-grouped by key (``cogroup(...).applyInPandas``) and :func:`~airflow_provider_checkpoint.core.
keyed_process.run_key` runs once per key; the other keys' rows stay as they are. The state holds one
row per key: the key columns, ``__state`` (the key's JSON document: state entries with their expiries,
timers) and the two wake-up times, so a checkpoint writes only the keys it changed, and an expired
entry, never read back, leaves the files with the next compaction of its range.

With ``watermark=(column, bound)``, or else the watermark declared on the sources upstream, the
operator has event time (:mod:`~airflow_provider_checkpoint.core.event_time`): rows without a time are
dropped and counted (``rows_without_event_time``); late rows still reach ``process``
(``ctx.watermark`` tells them apart). Without one, event-time timers and event-time TTL are refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.core.event_time import WatermarkProgress
from airflow_provider_checkpoint.core.keyed_process import (
    Clocks,
    KeyedProcessFunction,
    check_function,
    run_key,
)
from airflow_provider_checkpoint.core.keyed_state import declaration
from airflow_provider_checkpoint.core.model import Barrier
from airflow_provider_checkpoint.dataflow.expiry import EVENT_TIME_COLUMNS, advance, with_event_time
from airflow_provider_checkpoint.dataflow.graph import Node
from airflow_provider_checkpoint.dataflow.keyed_join import OTHER, keys_match, other_side
from airflow_provider_checkpoint.dataflow.operator import StatefulOperator
from airflow_provider_checkpoint.dataflow.schema_ddl import DdlError, parse_schema
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

STATE, WAKE_EVENT, WAKE_PROCESSING = "__state", "__wake_event", "__wake_processing"
_IS_STATE = "__is_state"  # a result row: True, the key's new state; False, an emitted row; null, counts only
_COUNTS = ("__fired", "__expired")  # a key's timers fired and state entries expired, on its first result row


class KeyedProcess(StatefulOperator):
    """Run ``function`` (a :class:`KeyedProcessFunction` instance) per key of ``keys`` over ``input``;
    its output has the columns of the function's ``output_schema``."""

    def __init__(
        self,
        uid: str,
        input: Node,
        keys: Sequence[str],
        function: KeyedProcessFunction,
        watermark: tuple[str, str] | None = None,
        max_parallelism: int = 128,
    ) -> None:
        super().__init__(uid, input, keys, max_parallelism)
        self._step_metrics: dict[str, int] = {}
        self.specs = check_function(uid, function)
        self.function = function
        try:
            self.output_columns = [c.name for c in parse_schema(function.output_schema)]
        except DdlError as e:
            raise PipelineDefinitionError(
                f"{uid}: output_schema {function.output_schema!r} is not a valid schema: {e}; "
                "write Spark DDL, e.g. 'user STRING, at TIMESTAMP'"
            ) from None
        if internal := [c for c in self.output_columns if c.startswith("__")]:
            raise PipelineDefinitionError(
                f"{uid}: output column(s) {internal} start with '__', kept for internal columns; rename them"
            )
        by_event = [n for n, s in self.specs.items() if (ttl := s.ttl_spec()) and ttl.time == "event"]
        self.watermark = self.own_watermark(watermark, f"state {by_event} with an event-time TTL" if by_event else None)

    def describe(self) -> dict[str, object]:
        return {
            **super().describe(),
            "function": type(self.function).__qualname__,
            "states": {n: [s.kind, s.type] for n, s in self.specs.items()},
            **({"watermark": [self.watermark.column, self.watermark.bound_ms]} if self.watermark else {}),
        }

    def state_declaration(self) -> dict[str, str]:
        """Each state's kind, stored types and TTL clock: a state read as another kind or type, or its
        expiries by the other clock, would be read wrongly. A removed state is a change too: keys the
        job does not visit keep its entries, which a state declared again under the name would read."""
        return {f"state {name}": declaration(spec) for name, spec in sorted(self.specs.items())}

    def process_metrics(self) -> dict[str, int]:
        """``timers_fired`` and ``state_entries_expired`` (by TTL) of the last checkpoint run."""
        metrics, self._step_metrics = self._step_metrics, {}
        return metrics

    def initial_state(self, spark: SparkSession, inputs: Mapping[str, DataFrame]) -> DataFrame:
        from pyspark.sql.types import LongType, StringType, StructField, StructType

        keys = inputs[self.inputs[0].uid].select(*self.keys).schema.fields
        extra = [
            StructField(STATE, StringType()),
            StructField(WAKE_EVENT, LongType()),
            StructField(WAKE_PROCESSING, LongType()),
        ]
        return spark.createDataFrame([], StructType([*keys, *extra]))

    def event_time(
        self, inputs: Mapping[str, DataFrame], before: WatermarkProgress, barrier: Barrier
    ) -> tuple[WatermarkProgress, dict[str, int]] | None:
        if self.watermark is None:
            return None
        rows = with_event_time(inputs[self.inputs[0].uid], self.uid, self.watermark.column, keep_nulls=True)
        return advance(rows, before, self.watermark.bound_ms)

    def process(
        self, inputs: Mapping[str, DataFrame], state: DataFrame, barrier: Barrier
    ) -> tuple[DataFrame, DataFrame]:
        return self._run(inputs, state, Clocks.of_checkpoint(barrier.trigger_time))

    def process_at(
        self,
        inputs: Mapping[str, DataFrame],
        state: DataFrame,
        barrier: Barrier,
        before: WatermarkProgress,
        after: WatermarkProgress,
    ) -> tuple[DataFrame, DataFrame]:
        return self._run(inputs, state, Clocks.of_checkpoint(barrier.trigger_time, before, after))

    def _run(self, inputs: Mapping[str, DataFrame], state: DataFrame, clocks: Clocks) -> tuple[DataFrame, DataFrame]:
        """The new state (visited keys' rows from the function, the others' as they were) and the output."""
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import BooleanType, LongType, StructField, StructType

        rows = inputs[self.inputs[0].uid]
        if self.watermark is not None:
            rows = with_event_time(rows, self.uid, self.watermark.column).drop(*EVENT_TIME_COLUMNS)
        touched = other_side(rows.select(*self.keys).distinct().withColumn("__rows", F.lit(True)))
        flagged = state.join(touched, keys_match(self.keys), "left").select(*state.columns, OTHER + "__rows")
        due = F.col(OTHER + "__rows").isNotNull() | (F.col(WAKE_PROCESSING) <= F.lit(clocks.processing))
        if clocks.after is not None:
            due = due | (F.col(WAKE_EVENT) <= F.lit(clocks.after))
        flagged = flagged.withColumn("__visit", F.coalesce(due, F.lit(False))).persist()  # split in two
        kept = flagged.where(~F.col("__visit")).select(*state.columns)
        visited = flagged.where("__visit").select(*state.columns)
        output = spark_schema(rows.sparkSession, self.function.output_schema)
        outs = [StructField(f"__o{i}", f.dataType) for i, f in enumerate(output.fields)]
        state_fields = [StructField(f.name, f.dataType) for f in state.schema.fields]  # nullable: one side is null
        counts = [StructField(c, LongType()) for c in _COUNTS]
        result_schema = StructType([StructField(_IS_STATE, BooleanType()), *state_fields, *outs, *counts])
        ship_by_value(self.function)
        zone = rows.sparkSession.conf.get("spark.sql.session.timeZone") or "UTC"
        schema = to_arrow_schema(result_schema, timezone="UTC")
        call = _KeyCall(self, clocks, [f.name for f in state.schema.fields], schema, self._sort_columns(rows), zone)
        grouped = rows.groupBy(*self.keys).cogroup(visited.groupBy(*self.keys))
        result = grouped.applyInArrow(call.udf(), result_schema).persist()
        fired, expired = result.agg(*[F.sum(c) for c in _COUNTS]).first() or (None, None)
        self._step_metrics = {"timers_fired": int(fired or 0), "state_entries_expired": int(expired or 0)}
        new_state = kept.unionByName(result.where(F.col(_IS_STATE)).select(*state.columns))
        emitted = result.where(~F.col(_IS_STATE)).select(
            *[F.col(o.name).alias(f.name) for o, f in zip(outs, output.fields, strict=True)]
        )
        return new_state, emitted

    def _sort_columns(self, rows: DataFrame) -> list[str]:
        """The order of a key's rows given to ``process``: event time, then every orderable column."""
        from pyspark.sql.types import ArrayType, MapType, StructType

        simple = [f.name for f in rows.schema.fields if not isinstance(f.dataType, ArrayType | MapType | StructType)]
        first = [self.watermark.column] if self.watermark is not None else []
        return first + [c for c in simple if c not in first]


def ship_by_value(function: KeyedProcessFunction) -> None:
    """Pickle the function's module by value when the executors could not import it by name (a DAG
    file, which Airflow loads under a name of its own), as cloudpickle does for ``__main__``."""
    import importlib.machinery
    import sys

    from pyspark import cloudpickle

    module = sys.modules.get(type(function).__module__)
    if module is None or module.__name__ == "__main__":
        return
    if importlib.machinery.PathFinder.find_spec(module.__name__.partition(".")[0]) is None:
        cloudpickle.register_pickle_by_value(module)


def spark_schema(spark: SparkSession, ddl: str) -> Any:
    """The Spark ``StructType`` of a DDL string."""
    return spark.createDataFrame([], ddl).schema


class _KeyCall:
    """The function ``applyInArrow`` runs on the executors for one key: its rows and its state row in,
    its new state row (if any) and its emitted rows out (``schema``, timestamps in UTC)."""

    def __init__(
        self,
        node: KeyedProcess,
        clocks: Clocks,
        state_columns: list[str],
        schema: pa.Schema,
        order: list[str],
        zone: str,
    ) -> None:
        self.zone = zone  # the session's time zone, in which Spark gives timestamps
        self.uid, self.function, self.specs = node.uid, node.function, node.specs
        self.columns, self.keys = node.output_columns, node.keys
        self.clocks, self.state_columns, self.schema, self.order = clocks, state_columns, schema, order

    def udf(self) -> Callable[[tuple[Any, ...], pa.Table, pa.Table], pa.Table]:
        """A plain function of (key, rows, state), as ``applyInArrow`` inspects its arguments."""

        def call(key: tuple[Any, ...], rows: pa.Table, state: pa.Table) -> pa.Table:
            return self(key, rows, state)

        return call

    def __call__(self, key: tuple[Any, ...], rows: pa.Table, state: pa.Table) -> pa.Table:
        stored = state.column(STATE)[0].as_py() if state.num_rows else None
        given = None
        if rows.num_rows:
            given = self._arrow_rows(rows) if self.function.rows_format == "arrow" else self._pandas_rows(rows)
        plain = tuple(_utc_scalar(k).as_py() for k in key)
        result = run_key(self.uid, self.function, self.specs, self.columns, plain, given, stored, self.clocks)
        records: list[list[Any]] = []
        outputs = len(self.columns)
        if result.state is not None:
            records.append([True, *plain, result.state, *result.wake, *[None] * outputs])
        blank_state = [None] * (len(self.state_columns) - len(self.keys))
        for row in result.emitted:
            records.append([False, *[None] * len(self.keys), *blank_state, *row])
        counts = [result.fired, result.expired]
        if any(counts) and not records:
            records.append([None, *[None] * len(self.keys), *blank_state, *[None] * outputs])
        for i, record in enumerate(records):
            record += counts if i == 0 else [None, None]
        return self._table(records)

    def _arrow_rows(self, rows: pa.Table) -> pa.Table:
        """The key's rows in order, timestamps in UTC."""
        import pyarrow.compute as pc

        order = [(c, "ascending", "at_start") for c in self.order]
        return _utc(rows.take(pc.sort_indices(rows, sort_keys=order)) if rows.num_rows > 1 else rows)

    def _pandas_rows(self, rows: pa.Table) -> pd.DataFrame:
        """The key's rows as ``applyInPandas`` would give them (Spark's own conversion), in order,
        timestamps UTC-aware."""
        import pandas as pd
        from pyspark.sql.conversion import ArrowBatchTransformer
        from pyspark.sql.pandas.types import from_arrow_schema

        series = ArrowBatchTransformer.to_pandas(rows, timezone=self.zone, schema=from_arrow_schema(rows.schema))
        frame = pd.concat(series, axis=1)
        if len(frame) > 1:
            frame = frame.sort_values(self.order, kind="mergesort", na_position="first").reset_index(drop=True)
        for column in frame.columns:
            if isinstance(frame[column].dtype, pd.DatetimeTZDtype):
                frame[column] = frame[column].dt.tz_convert("UTC")
            elif pd.api.types.is_datetime64_dtype(frame[column]):
                frame[column] = frame[column].dt.tz_localize(self.zone).dt.tz_convert("UTC")
        return frame

    def _table(self, records: list[list[Any]]) -> pa.Table:
        import pyarrow as pa

        columns = list(zip(*records, strict=True)) if records else [()] * len(self.schema)
        names = [_IS_STATE, *self.state_columns, *self.columns, *_COUNTS]
        arrays = [
            _column(self.uid, name, list(values), field)
            for name, values, field in zip(names, columns, self.schema, strict=True)
        ]
        return pa.Table.from_arrays(arrays, schema=self.schema)


def _column(uid: str, name: str, values: list[Any], field: pa.Field) -> pa.Array:
    """``values`` as an array of ``field``'s type, refused (naming the column) where Spark's safe cast
    would refuse it: a fraction into an integer column, a value of another kind."""
    import pandas as pd
    import pyarrow as pa

    if not (pa.types.is_integer(field.type) and any(isinstance(v, float) for v in values)):
        try:  # pyarrow's direct conversion truncates floats into integers: those take the safe path below
            return pa.array(values, type=field.type, from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
            pass
    try:
        return pa.Array.from_pandas(pd.Series(values), type=field.type, safe=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
        raise ValueError(f"{uid}: an emitted value of column {name!r} is not a {field.type}: {str(e)[:200]}") from None


def _utc(table: pa.Table) -> pa.Table:
    """``table`` with its timestamp columns in UTC (Spark gives them in the session's time zone)."""
    import pyarrow as pa

    fields = [
        pa.field(f.name, pa.timestamp(f.type.unit, tz="UTC"), f.nullable) if pa.types.is_timestamp(f.type) else f
        for f in table.schema
    ]
    return table.cast(pa.schema(fields))


def _utc_scalar(value: pa.Scalar) -> pa.Scalar:
    import pyarrow as pa

    return value.cast(pa.timestamp(value.type.unit, tz="UTC")) if pa.types.is_timestamp(value.type) else value
