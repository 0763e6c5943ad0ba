"""Checkpointing one stateful operator: a full version of its state, or only what changed.

A checkpoint continues its restore point incrementally when that is a checkpoint of this
job in this storage with its state in files (not a savepoint, not inline state, not memory
storage) and the operator keeps one row per key: it writes a delta per key-group range
with the changed keys, compacts the ranges :meth:`StateLayout.to_compact` picks, and
lists the files of the restore point it keeps.
When the operator's changelog lists every key and most changed, it writes a full version
from it instead. Otherwise it writes a full version (and the next checkpoint continues from that).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.core.event_time import WatermarkProgress
from airflow_provider_checkpoint.core.faults import fault_point
from airflow_provider_checkpoint.core.model import Barrier
from airflow_provider_checkpoint.core.settings import CheckpointSettings
from airflow_provider_checkpoint.dataflow.keyed_join import OTHER, keys_match, other_side
from airflow_provider_checkpoint.dataflow.observation import observed_metrics
from airflow_provider_checkpoint.dataflow.operator import CHANGED, DELETED, NEW, StatefulOperator
from airflow_provider_checkpoint.exceptions import StateFileError, raised_in_spark
from airflow_provider_checkpoint.state.driver_merge import (
    Closing,
    closing_column,
    driver_partials,
    first_on_driver,
    held_partials,
    merge_on_driver,
)
from airflow_provider_checkpoint.state.first_version import first_full_version, first_version_on_driver
from airflow_provider_checkpoint.state.handles import OperatorSnapshot, StateHandle
from airflow_provider_checkpoint.state.incremental import FULL_VERSION_SHARE, RANGE_ROWS, StateLayout
from airflow_provider_checkpoint.state.operator_checkpoint import OperatorCheckpoint, full_version_metrics, range_of
from airflow_provider_checkpoint.state.ownership import keeps_files_of
from airflow_provider_checkpoint.state.spark_backend import (
    RANGE,
    SEQ,
    delta_schema,
    merge,
    range_index,
    read_files,
    read_state,
    state_schema,
    write_full_version,
    write_ranges,
    write_state,
)
from airflow_provider_checkpoint.storage import Location

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, Row, SparkSession


Process = Callable[["Mapping[str, DataFrame]", "DataFrame", Barrier], "tuple[DataFrame, DataFrame]"]
Changes = Callable[["Mapping[str, DataFrame]", "DataFrame", Barrier], "tuple[DataFrame, DataFrame] | None"]


def checkpoint_operator(
    spark: SparkSession,
    storage: Location,
    directory: str,
    checkpoint_id: int,
    node: StatefulOperator,
    inputs: Mapping[str, DataFrame],
    barrier: Barrier,
    restored: OperatorSnapshot | None,
    restore_base: Location,
    settings: CheckpointSettings,
    where: Mapping[str, object],
    held: Mapping[str, pa.Table] | None = None,
) -> OperatorCheckpoint:
    """Run ``node`` over ``inputs`` from the ``restored`` state and write its new state under ``directory``.

    ``where`` names the step attempt at fault points (``step`` and ``attempt``). ``held``: by source uid, the
    rows of an input its source read on the driver (the same as its DataFrame in ``inputs``), which a merge on
    the driver reduces there with no Spark job (:func:`held_partials`). An operator with
    event time (:meth:`StatefulOperator.event_time`) advances the watermark of its restore point,
    and its snapshot records the one reached.
    """
    before = (restored.event_time if restored is not None else None) or WatermarkProgress()
    timed = node.event_time(inputs, before, barrier)
    process: Process | None = None
    changes: Changes | None = None
    if timed is not None:
        after, metrics = timed

        def process(inputs: Mapping[str, DataFrame], state: DataFrame, barrier: Barrier) -> tuple[DataFrame, DataFrame]:
            return node.process_at(inputs, state, barrier, before, after)

        def changes(
            inputs: Mapping[str, DataFrame], state: DataFrame, barrier: Barrier
        ) -> tuple[DataFrame, DataFrame] | None:
            return node.changes_at(inputs, state, barrier, before, after)

    try:
        result = _checkpoint_operator(
            spark,
            storage,
            directory,
            checkpoint_id,
            node,
            inputs,
            barrier,
            restored,
            restore_base,
            settings,
            where,
            process,
            changes,
            None if timed is None else (before, timed[0]),
            held,
        )
    except Exception as e:  # a state file refused on the driver or in a Spark task: say which checkpoint read it
        refused = e if isinstance(e, StateFileError) else raised_in_spark(e)
        if not isinstance(refused, StateFileError):
            raise
        raise StateFileError(f"checkpoint {checkpoint_id}, reading the state of {node.uid!r}: {refused}") from e
    declared = replace(result.snapshot, declaration=tuple(sorted(node.state_declaration().items())))
    counted = {**result.metrics, **node.process_metrics()}
    if timed is None:
        return replace(result, snapshot=declared, metrics=counted)
    return replace(result, snapshot=replace(declared, event_time=after), metrics={**counted, **metrics})


def _checkpoint_operator(
    spark: SparkSession,
    storage: Location,
    directory: str,
    checkpoint_id: int,
    node: StatefulOperator,
    inputs: Mapping[str, DataFrame],
    barrier: Barrier,
    restored: OperatorSnapshot | None,
    restore_base: Location,
    settings: CheckpointSettings,
    where: Mapping[str, object],
    process: Process | None = None,
    changes: Changes | None = None,
    watermarks: tuple[WatermarkProgress, WatermarkProgress] | None = None,
    held: Mapping[str, pa.Table] | None = None,
) -> OperatorCheckpoint:
    """:func:`checkpoint_operator`; ``process`` given (event time), it runs in place of the operator's
    :meth:`~StatefulOperator.process` and of its other forms (changelog, driver merge, first state),
    which know no watermark; ``changes`` (event time too) in place of its changelog form, and
    ``watermarks`` (before and after the checkpoint) choose its driver merge's form
    (:meth:`~StatefulOperator.partials_at`)."""
    forms = process is None
    process = process or node.process

    def fault(point: str) -> None:
        fault_point(point, checkpoint=checkpoint_id, **where)

    own = keeps_files_of(storage, restore_base)
    incremental = settings.incremental_state and settings.max_inline_state is None and node.one_row_per_key
    layout = StateLayout.of(restored) if restored is not None and own and incremental else None
    closing = None if watermarks is None else closing_column(node, watermarks[1])
    before = None if watermarks is None else watermarks[0]
    if layout is not None and restored is not None and not layout.wants_more_ranges(restored.rows):
        # a small state merges on the driver, compacting every range that is due (all of them too)
        partials = driver_partials(node, inputs, restored, settings, before, held_partials(node, held, before))
        if partials is not None:  # only then the operator's closing (a KeyedProcess has none to merge at)
            closes = None if watermarks is None else Closing.of(node, watermarks[1])
            operator = _OperatorState(storage, directory, checkpoint_id, node, restored, where, closing)
            return OperatorCheckpoint(
                *merge_on_driver(
                    spark, storage, directory, checkpoint_id, node, partials, restored, layout, operator.fault, closes
                )
            )
    if layout is not None and restored is not None and layout.due_for_full_version(restored.rows):
        fault("step.during_compaction")  # a full version compacts all
        layout = None
    if layout is not None and restored is not None:
        operator = _OperatorState(storage, directory, checkpoint_id, node, restored, where, closing)
        state = read_state(spark, storage, restored, verify=False, uid=node.uid)
        changelog, output = (node.changes(inputs, state, barrier, restored.rows) if forms else None), None
        if changelog is None and changes is not None:
            changelog, output = changes(inputs, state, barrier) or (None, None)
        if changelog is None:
            new_state, output = process(inputs, state, barrier)
            changelog = diff(state, new_state, node.keys) if _same_columns(new_state, restored) else None
        if changelog is not None and _same_columns(changelog, restored):
            return operator.incremental(layout, changelog, output)
    if restored is None and watermarks is not None and own and incremental:
        merged = first_on_driver(spark, storage, directory, checkpoint_id, node, inputs, settings, watermarks, fault)
        if merged is not None:
            return OperatorCheckpoint(*merged)
    if restored is None and forms:
        at, computed = {**where, "checkpoint": checkpoint_id}, held_partials(node, held, before)
        first = first_version_on_driver(storage, directory, node, inputs, settings, at, computed)
        first = first or first_full_version(storage, directory, node, inputs, settings, at)
        if first is not None:
            return first
    state = (
        read_state(spark, restore_base, restored, verify=False, uid=node.uid)
        if restored is not None
        else node.initial_state(spark, inputs)
    )
    new_state, output = process(inputs, state, barrier)
    fault("step.before_state_write")
    snapshot = write_state(
        storage,
        directory,
        new_state,
        node.keys,
        node.max_parallelism,
        inline_threshold=settings.inline_state_threshold,
        max_inline=settings.max_inline_state,
        uid=node.uid,
        closing=closing,
    )
    fault("step.after_state_write")
    return OperatorCheckpoint(snapshot, output, full_version_metrics(snapshot))


def diff(old: DataFrame, new: DataFrame, keys: tuple[str, ...]) -> DataFrame:
    """The changelog from state ``old`` to ``new``: one row per key added, changed or removed."""
    from pyspark.sql import functions as F

    values = [c for c in new.columns if c not in keys]
    joined = new.withColumn("__in_new", F.lit(True)).join(
        other_side(old.withColumn("__in_old", F.lit(True))), keys_match(keys), "full_outer"
    )
    in_new, in_old = F.col("__in_new").isNotNull(), F.col(OTHER + "__in_old").isNotNull()
    same = (
        F.struct(*[F.col(c) for c in values]).eqNullSafe(F.struct(*[F.col(OTHER + c).alias(c) for c in values]))
        if values
        else F.lit(True)
    )
    return joined.where(~in_new | ~in_old | ~same).select(
        *[F.coalesce(F.col(k), F.col(OTHER + k)).alias(k) for k in keys],
        *values,
        (~in_new).alias(DELETED),
        (~in_old).alias(NEW),
    )


def _same_columns(df: DataFrame, snapshot: OperatorSnapshot) -> bool:
    """The state columns (names and types, in order) of ``df`` are those of ``snapshot``."""
    schema = state_schema(snapshot)
    columns = [(f.name, f.dataType) for f in df.schema.fields if f.name not in (DELETED, NEW, CHANGED)]
    return columns == [(f.name, f.dataType) for f in schema.fields]


@dataclass(frozen=True)
class _OperatorState:
    """One operator's state in one step attempt: what it restored, where its new state goes."""

    storage: Location
    directory: str
    checkpoint_id: int
    node: StatefulOperator
    restored: OperatorSnapshot
    where: Mapping[str, object]
    closing: str | None = None
    """The operator's closing column (:meth:`StatefulOperator.closes_below`), recorded in its files' handles."""

    def fault(self, point: str) -> None:
        fault_point(point, checkpoint=self.checkpoint_id, **self.where)

    def incremental(self, layout: StateLayout, changelog: DataFrame, output: DataFrame | None) -> OperatorCheckpoint:
        """Write the changed keys as deltas (compacting the chosen ranges instead) next to the kept files.

        ``output`` ``None``: the output is the new rows of the changed keys (:meth:`StatefulOperator.changes`).
        """
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        keys, max_parallelism, parallelism = self.node.keys, self.node.max_parallelism, layout.parallelism
        columns = state_schema(self.restored).fieldNames()
        every_key = CHANGED in changelog.columns  # unchanged keys listed too, the changed ones marked
        changelog = changelog.select(
            *columns,
            F.col(DELETED).cast("boolean"),
            F.col(NEW).cast("boolean"),
            *([F.col(CHANGED).cast("boolean")] if every_key else []),
        ).persist()
        small = self.restored.rows <= RANGE_ROWS
        big = False  # a delta of more than RANGE_ROWS rows is written by one task per range
        if every_key:
            # count when recent checkpoints may have changed most keys, or when a large state's
            # changelog lists every key (a big increment): most may change in this one
            if not layout.has_deltas or not small:
                totals = (
                    (changelog.coalesce(1) if small else changelog)  # one task counts a small cached changelog
                    .agg(
                        F.count(F.lit(1)).alias("keys"),
                        F.coalesce(F.sum(F.col(CHANGED).cast("long")), F.lit(0)).alias("changed"),
                        F.coalesce(F.sum((~F.col(DELETED)).cast("long")), F.lit(0)).alias("rows"),
                    )
                    .first()
                )
                assert totals is not None
                if totals["changed"] >= FULL_VERSION_SHARE * totals["keys"]:
                    return self.full_version_from(changelog, totals, output)
                big = totals["changed"] > RANGE_ROWS
            changelog = changelog.where(F.col(CHANGED)).drop(CHANGED)
        changelog = changelog.withColumn(RANGE, range_index(keys, max_parallelism, parallelism))
        compact = layout.to_compact()
        self.fault("step.before_state_write")
        observation = Observation()  # the counts come from the pass that writes the deltas
        delta_metrics = (
            F.count(F.lit(1)).alias("changed"),
            F.coalesce(F.sum(F.col(NEW).cast("long")), F.lit(0)).alias("inserted"),
            F.coalesce(F.sum((F.col(DELETED) & ~F.col(NEW)).cast("long")), F.lit(0)).alias("deleted"),
        )
        newest = changelog.withColumn(SEQ, F.lit(self.checkpoint_id).cast("long")).drop(NEW)
        delta = (
            changelog.observe(observation, *delta_metrics)
            .where(~F.col(RANGE).isin(compact))
            .withColumn(SEQ, F.lit(self.checkpoint_id).cast("long"))
            .drop(NEW, RANGE)
        )
        written: dict[int, list[StateHandle]] = {}
        for handle in write_ranges(
            self.storage,
            f"{self.directory}/delta",
            delta,
            keys,
            max_parallelism,
            parallelism,
            self.checkpoint_id,
            spread=big,
            closing=self.closing,
        ):
            written.setdefault(range_of(handle, max_parallelism, parallelism), []).append(handle)
        counts = observed_metrics(observation, lambda: changelog.agg(*delta_metrics).first())
        compacted: dict[int, list[StateHandle]] = {i: [] for i in compact}
        if compact:
            self.fault("step.during_compaction")
            kept = [h for i in compact for h in layout.ranges[i].handles]
            spark = changelog.sparkSession
            schema = state_schema(self.restored)
            files = [h for h in kept if h.delta is None]
            full = read_files(spark, self.storage, files, schema, keys, max_parallelism)
            deltas = [h for h in kept if h.delta is not None]
            older = read_files(spark, self.storage, deltas, delta_schema(schema), keys, max_parallelism)
            layers = 1 + len({h.delta for h in kept if h.delta is not None})
            merged = merge(
                full, older.unionByName(newest.where(F.col(RANGE).isin(compact)).drop(RANGE)), keys, True, layers
            )
            for handle in write_ranges(
                self.storage,
                f"{self.directory}/compacted",
                merged,
                keys,
                max_parallelism,
                parallelism,
                closing=self.closing,
            ):
                compacted[range_of(handle, max_parallelism, parallelism)].append(handle)
        self.fault("step.after_state_write")
        new_files = [h for hs in (*written.values(), *compacted.values()) for h in hs]
        snapshot = OperatorSnapshot(
            handles=layout.handles_after(written, compacted),
            schema=self.restored.schema,
            keys=keys,
            max_parallelism=max_parallelism,
            rows=self.restored.rows + counts["inserted"] - counts["deleted"],
        )
        metrics = {
            "state_rows": snapshot.rows,
            "state_bytes": sum(h.size for h in new_files),
            "state_files": len(new_files),
            "state_keys_changed": counts["changed"],
            "state_ranges_compacted": len(compact),
            "state_size": snapshot.size,
            "state_incremental": 1,
        }
        if output is None:
            output = self.node.output_of(changelog.where(~F.col(DELETED)).select(*columns))
        return OperatorCheckpoint(snapshot, output, metrics)

    def full_version_from(self, changelog: DataFrame, totals: Row, output: DataFrame | None) -> OperatorCheckpoint:
        """Write every key's new state as a full version (``changelog`` lists every key)."""
        from pyspark.sql import functions as F

        columns = state_schema(self.restored).fieldNames()
        self.fault("step.before_state_write")
        state = changelog.where(~F.col(DELETED)).select(*columns)
        snapshot = write_full_version(
            self.storage,
            self.directory,
            state,
            int(totals["rows"]),
            self.restored.schema,
            self.node.keys,
            self.node.max_parallelism,
            closing=self.closing,
        )
        self.fault("step.after_state_write")
        if output is None:
            output = self.node.output_of(changelog.where(F.col(CHANGED) & ~F.col(DELETED)).select(*columns))
        metrics = {**full_version_metrics(snapshot), "state_keys_changed": int(totals["changed"])}
        return OperatorCheckpoint(snapshot, output, metrics)
