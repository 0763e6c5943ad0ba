"""Exactly-once into a PostgreSQL table through an Airflow ``postgres`` connection.

- **Step** (writer, this module): the executors ``COPY`` the checkpoint's rows in parallel into a staging table
  unique to the checkpoint attempt (:func:`~.sql.staging_table`); rows the driver holds already (an
  input merged there, or read there by its source: ``driver_rows``) go from the driver, with no Spark
  job, and so does a DataFrame whose row count the step knows to be small (a stateful operator's output:
  ``driver_rows``, ``driver_bytes``), collected first in one ``toArrow()``. A value PostgreSQL
  refuses fails the step, naming column and key, or with ``dead_letter_table`` its row goes there
  instead (:mod:`.dead_letters`). The committable is ``{"checkpoint_id", "staging_table", "rows"}``
  (and ``"dead_letters"``, a count, with a dead-letter table): names and counts only. Staging tables
  are ordinary, WAL-logged tables (never UNLOGGED, which crash recovery empties): once the step's
  load has committed, what ``_metadata`` will name survives a crash of the server and reaches its
  replicas, so a completed checkpoint can always commit.
- **Finalize** (committer, :mod:`.committer`): ONE transaction moves the staged rows into the table (``INSERT``,
  or, upsert, ``DELETE … USING`` the staged rows that delete their key, then ``INSERT … ON CONFLICT
  (keys) DO UPDATE`` of the others), inserts the marker row ``(job, sink uid, table,
  checkpoint id)`` into ``checkpoint_sink_markers`` and drops the staging table. A retry, or
  the trigger's recovery, finds the marker and does nothing. With ``partition_per_checkpoint`` an
  append commit attaches the staging table as the checkpoint's partition instead of copying its
  rows (:mod:`.partitions`). The first load into a table the sink makes (absent, ``create_table``) makes
  it of the staging table in that transaction, copying no row (:func:`~.staging.take_over`).
- **Restore** to checkpoint N, in one transaction: ``append`` deletes the rows whose
  ``_checkpoint_id`` column is newer than N; ``upsert`` puts back the before-images of every key
  the newer checkpoints changed, kept in ``_cks_<sink>_undo`` for the ``undo_checkpoints`` newest
  committed checkpoints (older ones are purged by the commit that passes them).
- **Claim**: a row in ``checkpoint_sink_claims`` gives the table to one (job, sink uid, mode, keys)
  (:mod:`.claims`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.connectors.base.sink import check_mode, check_schema_evolution
from airflow_provider_checkpoint.connectors.base.upsert_rule import UpsertRows, check_sequence_by
from airflow_provider_checkpoint.connectors.postgres import sql as pg
from airflow_provider_checkpoint.connectors.postgres import staging, target
from airflow_provider_checkpoint.connectors.postgres.committer import PostgresCommitter
from airflow_provider_checkpoint.core.model import JsonDict
from airflow_provider_checkpoint.dataflow.driver_rows import estimated_bytes, rows_then_bytes_within
from airflow_provider_checkpoint.dataflow.graph import Node
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from airflow_provider_checkpoint.dataflow.context import StepContext
    from airflow_provider_checkpoint.dataflow.driver_rows import SourceRows

log = logging.getLogger(__name__)

DRIVER_ROWS = 2_000_000
"""Rows of a checkpoint's input staged from the driver at most (``driver_rows``)."""
DRIVER_BYTES = 128 << 20
"""Spark's estimate of a DataFrame input's size at most, for it to be collected into the driver (``driver_bytes``)."""


class PostgresTableSink(PostgresCommitter):
    """Exactly-once PostgreSQL table in ``append`` or ``upsert`` (by ``keys``) mode; one short
    transaction per checkpoint, no lock held across it, no prepared transactions.

    :param uid: stable id of the sink (names its staging tables, marker and claim rows).
    :param input: the node whose records are written.
    :param conn_id: an Airflow connection of type ``postgres`` (host, port, login, password,
        database in ``schema``; ``sslmode``/``sslrootcert``/``connect_timeout``/… in extras).
    :param table: ``name`` or ``schema.name``; its schema also holds the sink's bookkeeping tables.
    :param mode: ``append`` (every checkpoint adds its rows, tagged in ``_checkpoint_id``) or
        ``upsert`` (one row per key, replaced by newer checkpoints).
    :param keys: upsert key columns (a unique index on them is required; ``create_table``
        creates one ``NULLS NOT DISTINCT``, so a null key part is a key value: docs/postgres.md).
    :param create_table: create the table from the input's columns when it does not exist.
    :param undo_checkpoints: upsert mode: how many newest committed checkpoints a restore can
        return to (keep it ≥ the job's ``retained_checkpoints``); before-images older than that
        are purged.
    :param dead_letter_table: ``name`` (in the table's schema) or ``schema.name``: rows holding a
        value PostgreSQL refuses go there, committed with the checkpoint, instead of failing the
        step (:mod:`.dead_letters`); created if absent.
    :param max_refused_fraction: with a dead-letter table, a checkpoint in which more than this
        fraction of the rows is refused is declined.
    :param step: run in the named step (see :class:`~airflow_provider_checkpoint.dataflow.graph.Sink`).
    :param sequence_by: Upsert mode: the column(s) that order several rows of one key in a
        checkpoint, greatest wins; ``None``: the later row in source order (:mod:`.upsert_rule`).
    :param delete_when: Upsert mode: a boolean input column; a key whose winning row (the rule of
        :mod:`.upsert_rule`) has it true is deleted from the table (a restore puts it back), and the column
        is not written (e.g. ``"tombstone"`` of a ``KafkaSource(upsert=True)``).
    :param deletes: Upsert mode with ``delete_when``: ``"hard"`` (default) removes a deleted key; ``"soft"``
        keeps the delete's row with ``deleted_column`` true, every other row with it false, so a later
        insert of the key revives it (:mod:`~airflow_provider_checkpoint.connectors.base.soft_delete`).
    :param deleted_column: Soft deletes: the table's boolean column marking a deleted key (default
        ``__deleted``, Debezium's name; it may be the ``delete_when`` column itself).
    :param partition_per_checkpoint: append mode: the commit attaches the staged rows as the
        checkpoint's partition of a table partitioned ``PARTITION BY LIST (_checkpoint_id)`` instead of
        copying them (:mod:`.partitions`); ``create_table`` creates it so, an existing table must be.
    :param schema_evolution: ``"none"`` (default): input columns must be the table's. ``"additive"``: an
        input column the table lacks is added (``ALTER TABLE … ADD COLUMN``, nullable, typed as
        ``create_table`` types it) and a number column the input widens (smallint → integer → bigint,
        real → double precision) is widened (``ALTER COLUMN … TYPE``), both inside the checkpoint's commit
        transaction (:func:`~.target.follow_staged`); never a dropped, narrowed or otherwise retyped column.
    :param driver_rows: a checkpoint's input that its source read on the driver (the source feeding only this
        sink: :meth:`~airflow_provider_checkpoint.dataflow.graph.Source.read_in_driver`) is staged from the
        driver, with no Spark job, whatever its number of rows (the source bounds them; reduced there to one row
        per key by :mod:`~airflow_provider_checkpoint.connectors.base.upsert_rule`'s code), unless this is ``0``;
        so is a DataFrame input whose row count the step knows (a stateful operator's output) to be at most this
        many, collected first (``driver_bytes``); more go through Spark's executors; ``0``: never.
    :param driver_bytes: a DataFrame input (not held by the driver) of at most ``driver_rows`` rows is collected
        into the driver (one ``df.toArrow()``) and staged from there only when Spark's estimate of its size
        (its plan's statistics, no job) is at most this many bytes; ``0``: never, its executors ``COPY`` it.
    """

    def __init__(
        self,
        uid: str,
        input: Node,
        conn_id: str,
        table: str,
        mode: str = "append",
        keys: list[str] | None = None,
        create_table: bool = True,
        undo_checkpoints: int = 3,
        dead_letter_table: str | None = None,
        max_refused_fraction: float = 0.5,
        step: str | None = None,
        sequence_by: list[str] | None = None,
        partition_per_checkpoint: bool = False,
        delete_when: str | None = None,
        deletes: str = "hard",
        deleted_column: str | None = None,
        schema_evolution: str = "none",
        driver_rows: int = DRIVER_ROWS,
        driver_bytes: int = DRIVER_BYTES,
    ) -> None:
        super().__init__(uid, input, step)
        check_mode(uid, mode)
        if mode == "upsert" and not keys:
            raise PipelineDefinitionError(f"{uid}: upsert mode needs keys")
        if undo_checkpoints < 1:
            raise PipelineDefinitionError(f"{uid}: undo_checkpoints must be at least 1")
        self.conn_id = conn_id
        self.schema, self.table_name = pg.split_table(uid, table)
        self.mode = mode
        self.keys = list(keys or [])
        pg.check_identifiers(uid, "keys", self.keys)
        self.sequence_by = check_sequence_by(uid, mode, self.keys, sequence_by)
        self.set_deletes(delete_when, deletes, deleted_column)
        self.create_table = create_table
        self.undo_checkpoints = undo_checkpoints
        self.digest = pg.sink_digest(self.schema, self.table_name, uid)
        self.dead_letters = None if dead_letter_table is None else self._dead_letter_table(dead_letter_table)
        if not 0 <= max_refused_fraction <= 1:
            raise PipelineDefinitionError(
                f"{uid}: max_refused_fraction must be in [0, 1], got {max_refused_fraction!r}"
            )
        self.max_refused_fraction = max_refused_fraction
        if partition_per_checkpoint and mode != "append":
            raise PipelineDefinitionError(f"{uid}: partition_per_checkpoint is for append mode")
        self.partition_per_checkpoint = partition_per_checkpoint
        self.schema_evolution = check_schema_evolution(uid, schema_evolution)
        for name, value in (("driver_rows", driver_rows), ("driver_bytes", driver_bytes)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise PipelineDefinitionError(f"{uid}: {name} must be an int >= 0, got {value!r}")
        self.driver_rows, self.driver_bytes = driver_rows, driver_bytes
        if partition_per_checkpoint and schema_evolution != "none":
            raise PipelineDefinitionError(
                f"{uid}: schema_evolution is not available with partition_per_checkpoint (a checkpoint's partition "
                "is staged with the table's columns)"
            )

    def _dead_letter_table(self, table: str) -> tuple[str, str]:
        schema, name = pg.split_table(self.uid, table if "." in table else f"{self.schema}.{table}")
        if (schema, name) == (self.schema, self.table_name):
            raise PipelineDefinitionError(f"{self.uid}: the dead-letter table cannot be the table itself")
        return schema, name

    def describe(self) -> dict[str, Any]:
        described = {**super().describe(), "format": "postgres", "table": self.target_name(), "mode": self.mode}
        if self.partition_per_checkpoint:
            described["partition_per_checkpoint"] = True
        if self.schema_evolution != "none":
            described["schema_evolution"] = self.schema_evolution
        return {**described, "dead_letters": ".".join(self.dead_letters)} if self.dead_letters else described

    # -- writer (step side) ------------------------------------------------------------
    def check_columns(self, schema: StructType) -> None:
        """The input's column names, then the table as the step checks it (:func:`~.target.check_target`), not
        creating it; a table the first stage would create: each column must have a PostgreSQL type."""
        staging.check_names(self.uid, schema)
        with self._connection().connect() as db:
            if target.check_target(self, db, schema, create=False):
                return
        for f in schema.fields:
            pg.pg_type(self.uid, f.name, f.dataType)

    def takes_source_rows(self) -> bool:
        """A source's output read on the driver is staged from there (:meth:`write_source_rows`,
        :meth:`write_upsert`), unless ``driver_rows`` is 0."""
        return self.driver_rows > 0

    def write(self, ctx: StepContext, df: DataFrame) -> list[JsonDict]:
        """Stage ``df`` by its executors' ``COPY``, or from the driver: the rows it holds (:meth:`held_input`), or,
        an append of a small input (:meth:`_collects`), ``df`` collected there."""
        held = self.held_input(ctx)
        count = ctx.output_rows.get(self.inputs[0].uid)
        if held is None and self.mode == "append" and self._collects(count, lambda: estimated_bytes(df)):
            held = self._collected(df.toArrow)
        return self._staged(ctx, df.schema, df if held is None else held)

    def _collects(self, count: int | None, size: Callable[[], int | None]) -> bool:
        """Whether a DataFrame input of ``count`` rows (as the step knows them: a stateful operator's output;
        ``None``: unknown) is collected into the driver and staged from there: at most ``driver_rows`` rows
        and, by Spark's estimate (``size``, asked only then; ``None``: unknown), at most ``driver_bytes``. One
        ``toArrow()`` then one ``COPY`` stream per driver thread cost less than the executors' ``COPY``, whose
        Python workers take the rows in Arrow batches from the JVM too and each open a connection
        (docs/benchmarks.md)."""
        return rows_then_bytes_within(count, self.driver_rows, size, self.driver_bytes)

    def _collected(self, collect: Callable[[], pa.Table | None]) -> pa.Table | None:
        """The rows of a DataFrame input in the driver, in its order, by ``collect`` (one Spark job, ``toArrow()``),
        logged with their time; ``None`` if ``collect`` declines them."""
        started = time.monotonic()
        rows = collect()
        if rows is not None:
            log.info(
                "sink %s: collected %d rows (%d bytes in Arrow) into the driver in %.2fs",
                self.uid, rows.num_rows, rows.nbytes, time.monotonic() - started,
            )  # fmt: skip
        return rows

    def write_source_rows(self, ctx: StepContext, read: SourceRows) -> list[JsonDict]:
        """An append of rows a source read on the driver: ``COPY`` from there, up to ``driver_rows`` of them."""
        if read.rows.num_rows > self.driver_rows:
            return self.write(ctx, read.frame())
        return self._staged(ctx, read.schema, read.rows)

    def _staged(
        self, ctx: StepContext, schema: StructType, rows: DataFrame | pa.Table, reduced: bool = False
    ) -> list[JsonDict]:
        staged = staging.stage(self, self._connection(), ctx, schema, rows, one_per_key=True, reduced=reduced)
        assert staged is not None  # only an input that may repeat a key is declined
        return [staged]

    def write_upsert(self, ctx: StepContext, rows: UpsertRows) -> list[JsonDict]:
        """Rows a source read on the driver, at most ``driver_rows``, are reduced there to one row per key
        (:meth:`UpsertRows.collect`: the rule's code, as Spark reduces them) and staged from there; so is a
        DataFrame input the driver does not hold, collected first (one Spark job), when :meth:`_collects`.

        Otherwise an input that may repeat a key is first staged as it is, without Spark's reduction to one
        row per key (a shuffle of every row): the staging table then holds each key once, and no row was
        refused, exactly when the reduction would have changed nothing, and that staging stands.
        Otherwise it is staged again, reduced (the rows as :meth:`UpsertRows.frame` gives them). Rows
        the driver holds (a stateful operator merged there) go from the driver, with no Spark job, as in
        :meth:`write`."""
        held = rows.in_driver.rows() if rows.in_driver is not None else None
        reduced = rows.collect(self.driver_rows) if rows.source is not None else None
        if rows.source is None and held is None and self._collects(rows.count, rows.estimated_bytes):
            reduced = self._collected(lambda: rows.collect(self.driver_rows))
        if reduced is not None:
            return self._staged(ctx, rows.schema, reduced, reduced=rows.reduce)
        if rows.reduce:
            data = rows.data()
            staged = staging.stage(
                self, self._connection(), ctx, data.schema, data if held is None else held, one_per_key=False
            )
            if staged is not None:
                return [staged]
        elif held is not None:  # one row per key, held: as :meth:`write` stages them, its DataFrame never made
            return self._staged(ctx, rows.schema, held)
        return self.write(ctx, rows.frame())
