"""Keyed operators over several inputs: your own co-state function, dimension enrichment (the interval
join: :mod:`.interval_join`).

Every input of an operator is read up to the same barrier (alignment): the operator sees,
for checkpoint N, exactly the records of each input between the restore point and
barrier N, and snapshots its state only after all of them. Everything is a function of
(restore point, barrier), so a retried step produces the same state and output.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.core.model import Barrier
from airflow_provider_checkpoint.dataflow.graph import Node
from airflow_provider_checkpoint.dataflow.operator import StatefulOperator
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

CoStateFunction = Callable[["Mapping[str, DataFrame]", "DataFrame"], "tuple[DataFrame, DataFrame]"]
_KIND = "_kind"
_DELETED_AT = "_deleted_at"
TOMBSTONE_RETENTION = datetime.timedelta(days=7)
"""How long (barrier time) :class:`DimensionEnrichment` remembers a delete's version by default."""
MAX_TOMBSTONE_RETENTION = datetime.timedelta(days=365)


class KeyedCoStateFunction(StatefulOperator):
    """Your own keyed operator over named inputs: ``fn(inputs_by_name, state) -> (new_state, output)``.

    ``inputs`` maps a name of your choice to an upstream node; ``fn`` receives the same
    names, each bound to that input's records of this checkpoint (aligned on one barrier).
    ``state`` has ``state_schema`` (Spark DDL), holds every key's state at the restore point
    and is replaced by ``new_state``, which must contain the ``keys`` columns and at most one
    row per key (a checkpoint writes only the keys whose row changed).
    """

    def __init__(
        self,
        uid: str,
        inputs: Mapping[str, Node],
        keys: Sequence[str],
        fn: CoStateFunction,
        state_schema: str,
        max_parallelism: int = 128,
    ) -> None:
        if len(inputs) < 2:
            raise PipelineDefinitionError(f"{uid}: a co-state function needs at least two named inputs")
        super().__init__(uid, list(inputs.values()), keys, max_parallelism)
        self.names = {node.uid: name for name, node in inputs.items()}
        self.fn = fn
        self.state_schema = state_schema

    def initial_state(self, spark: SparkSession, inputs: Mapping[str, DataFrame]) -> DataFrame:
        return spark.createDataFrame([], self.state_schema)

    def process(
        self, inputs: Mapping[str, DataFrame], state: DataFrame, barrier: Barrier
    ) -> tuple[DataFrame, DataFrame]:
        return self.fn({self.names[uid]: df for uid, df in inputs.items()}, state)


class DimensionEnrichment(StatefulOperator):
    """Facts joined with the latest version of a changing dimension, per key.

    The ``dimension`` input is a changelog: upserts, ordered per key by ``version`` (a
    column that grows with every change of a key), and deletes where ``delete_when`` (a
    SQL condition, e.g. ``"op = 'D'"``) is true; a condition that is false or NULL is an
    upsert. Its latest version per key is the state. A change replaces the stored version
    (row or delete) of its key when its ``version`` is greater, or equal and it arrives in
    a later checkpoint; among changes of one key and version in one checkpoint, a delete
    wins, then the greatest ``columns`` (compared in order, nulls lowest). A delete is kept
    as a tombstone with its version for ``tombstone_retention`` (barrier time; default
    :data:`TOMBSTONE_RETENTION`, at most :data:`MAX_TOMBSTONE_RETENTION`), so an older
    change arriving later is ignored; after that the tombstone is dropped from the state.
    Facts of checkpoint N are joined with the dimension **as of the end of N**: an update
    and a fact of the same key in one checkpoint give the updated row. ``columns`` of the
    dimension are added to every fact.

    A fact whose key has no dimension row follows ``on_missing``:

    - ``"emit"`` — emitted at once with nulls in ``columns``;
    - ``"hold"`` — kept in state and emitted in the first checkpoint whose dimension has
      the key; after ``hold_ttl`` (barrier time minus the time it was first held) it is
      emitted with nulls, so no fact is ever lost.
    """

    one_row_per_key = False

    def __init__(
        self,
        uid: str,
        facts: Node,
        dimension: Node,
        keys: Sequence[str],
        version: str,
        columns: Sequence[str],
        delete_when: str | None = None,
        on_missing: str = "emit",
        hold_ttl: datetime.timedelta | None = None,
        tombstone_retention: datetime.timedelta = TOMBSTONE_RETENTION,
        max_parallelism: int = 128,
    ) -> None:
        super().__init__(uid, [facts, dimension], keys, max_parallelism)
        if not datetime.timedelta(0) < tombstone_retention <= MAX_TOMBSTONE_RETENTION:
            raise PipelineDefinitionError(
                f"{uid}: tombstone_retention must be positive and at most {MAX_TOMBSTONE_RETENTION.days} days, "
                f"got {tombstone_retention}"
            )
        if on_missing not in ("emit", "hold"):
            raise PipelineDefinitionError(f"{uid}: on_missing must be 'emit' or 'hold', got {on_missing!r}")
        if on_missing == "hold" and (hold_ttl is None or hold_ttl.total_seconds() <= 0):
            raise PipelineDefinitionError(f"{uid}: on_missing='hold' needs a positive hold_ttl")
        if not columns or set(columns) & set(keys) or version in keys:
            raise PipelineDefinitionError(f"{uid}: columns must name non-key dimension columns, version not a key")
        self.facts, self.dimension = facts.uid, dimension.uid
        self.version, self.columns = version, tuple(columns)
        self.delete_when, self.on_missing, self.hold_ttl = delete_when, on_missing, hold_ttl
        self.tombstone_retention = tombstone_retention

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "on_missing": self.on_missing, "columns": list(self.columns)}

    def initial_state(self, spark: SparkSession, inputs: Mapping[str, DataFrame]) -> DataFrame:
        return spark.createDataFrame([], self._state_columns(inputs[self.facts], inputs[self.dimension]).schema)

    def _state_columns(self, facts: DataFrame, dimension: DataFrame) -> DataFrame:
        """An empty frame with the state's columns: kind (``dim``, ``deleted`` or ``held``), keys, version,
        columns, the held fact, held since, and when a tombstone's delete was applied."""
        from pyspark.sql import functions as F

        clash = set(self.columns) & set(facts.columns)
        if clash:
            raise PipelineDefinitionError(
                f"{self.uid}: dimension columns {sorted(clash)} also exist in the facts; rename them first"
            )
        return facts.limit(0).select(
            F.lit("dim").alias(_KIND),
            *[F.col(k) for k in self.keys],
            F.lit(None).cast(dimension.schema[self.version].dataType).alias(self.version),
            *[F.lit(None).cast(dimension.schema[c].dataType).alias(c) for c in self.columns],
            F.struct(*[F.col(c) for c in facts.columns]).alias("_fact"),
            F.lit(None).cast("double").alias("_held_since"),
            F.lit(None).cast("double").alias(_DELETED_AT),
        )

    def process(
        self, inputs: Mapping[str, DataFrame], state: DataFrame, barrier: Barrier
    ) -> tuple[DataFrame, DataFrame]:
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        facts, changes = inputs[self.facts], inputs[self.dimension]
        template = self._state_columns(facts, changes)
        keys = list(self.keys)
        now = F.lit(barrier.trigger_time)
        if _DELETED_AT not in state.columns:  # state written before tombstones existed: it has none
            state = state.withColumn(_DELETED_AT, F.lit(None).cast("double"))
        kept = (F.col(_KIND) == "dim") | (
            (F.col(_KIND) == "deleted") & (F.col(_DELETED_AT) + F.lit(self.tombstone_retention.total_seconds()) > now)
        )
        deleted = F.coalesce(F.expr(self.delete_when), F.lit(False)) if self.delete_when else F.lit(False)
        candidates = (
            state.where(kept)
            .select(*keys, self.version, *self.columns, (F.col(_KIND) == "deleted").alias("_deleted"), _DELETED_AT)
            .withColumn("_new", F.lit(0))
            .unionByName(
                changes.select(
                    *keys,
                    self.version,
                    *self.columns,
                    deleted.alias("_deleted"),
                    now.cast("double").alias(_DELETED_AT),
                    F.lit(1).alias("_new"),
                )
            )
        )
        ties = [F.col(c).desc_nulls_last() for c in self.columns]
        latest = Window.partitionBy(*keys).orderBy(
            F.col(self.version).desc(), F.col("_new").desc(), F.col("_deleted").desc(), *ties
        )
        newest = candidates.withColumn("_rank", F.row_number().over(latest)).where(F.col("_rank") == 1)
        dimension = newest.where(~F.col("_deleted")).select(*keys, self.version, *self.columns)
        tombstones = newest.where(F.col("_deleted")).select(
            F.lit("deleted").alias(_KIND), *keys, self.version, _DELETED_AT
        )
        fact_columns = facts.columns
        pending = facts.select(*fact_columns, F.lit(None).cast("double").alias("_held_since")).unionByName(
            state.where(F.col(_KIND) == "held").select("_fact.*", "_held_since")
        )
        joined = pending.join(dimension.select(*keys, *self.columns, F.lit(True).alias("_found")), keys, "left")
        found = F.col("_found").isNotNull()
        if self.on_missing == "emit":
            output, held = joined.select(*fact_columns, *self.columns), None
        else:
            assert self.hold_ttl is not None
            since = F.coalesce(F.col("_held_since"), F.lit(barrier.trigger_time))
            expired = since + F.lit(self.hold_ttl.total_seconds()) <= F.lit(barrier.trigger_time)
            output = joined.where(found | expired).select(*fact_columns, *self.columns)
            held = joined.where(~found & ~expired).select(*fact_columns, since.alias("_held_since"))
        new_state = template.unionByName(
            dimension.select(F.lit("dim").alias(_KIND), *keys, self.version, *self.columns),
            allowMissingColumns=True,
        ).unionByName(tombstones, allowMissingColumns=True)
        if held is not None:
            new_state = new_state.unionByName(
                held.select(
                    F.lit("held").alias(_KIND),
                    *keys,
                    F.struct(*[F.col(c) for c in fact_columns]).alias("_fact"),
                    "_held_since",
                ),
                allowMissingColumns=True,
            )
        return new_state.select(*template.columns), output
