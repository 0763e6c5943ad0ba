"""Exactly-once into a PostgreSQL table through an Airflow ``postgres`` connection.

- **Step** (writer): the executors ``COPY`` the checkpoint's rows in parallel into a staging table
  unique to the checkpoint attempt (:func:`~.sql.staging_table`); rows the driver holds already (an
  input merged there, or read there by its source: ``driver_rows``) go from the driver, in one stream,
  with no Spark job. A value PostgreSQL
  refuses fails the step, naming column and key, or with ``dead_letter_table`` its row goes there
  instead (:mod:`.dead_letters`). The committable is ``{"checkpoint_id", "staging_table", "rows"}``
  (and ``"dead_letters"``, a count, with a dead-letter table): names and counts only. Staging tables
  are ordinary, WAL-logged tables (never UNLOGGED, which crash recovery empties): once the step's
  load has committed, what ``_metadata`` will name survives a crash of the server and reaches its
  replicas, so a completed checkpoint can always commit.
- **Finalize** (committer): ONE transaction moves the staged rows into the table (``INSERT``,
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
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.connectors.base.sink import TransactionalSink, check_mode, check_schema_evolution
from airflow_provider_checkpoint.connectors.base.upsert_rule import (
    UpsertRows,
    check_sequence_by,
)
from airflow_provider_checkpoint.connectors.postgres import claims, dead_letters, partitions, staging, target, undo
from airflow_provider_checkpoint.connectors.postgres import sql as pg
from airflow_provider_checkpoint.connectors.postgres.connection import PgConnection
from airflow_provider_checkpoint.connectors.postgres.sql import CHECKPOINT_COLUMN
from airflow_provider_checkpoint.core.faults import fault_point
from airflow_provider_checkpoint.core.model import JsonDict
from airflow_provider_checkpoint.dataflow.graph import Node
from airflow_provider_checkpoint.exceptions import (
    CheckpointStorageError,
    PipelineDefinitionError,
    SinkConnectionError,
    SinkUnavailableError,
)

if TYPE_CHECKING:
    import psycopg
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from airflow_provider_checkpoint.dataflow.context import StepContext
    from airflow_provider_checkpoint.dataflow.driver_rows import SourceRows

log = logging.getLogger(__name__)

DRIVER_ROWS = 2_000_000
"""A source's output read on the driver of at most this many rows is staged from the driver (``driver_rows``)."""


class PostgresTableSink(TransactionalSink):
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
        driver, with no Spark job, when it has at most this many rows (reduced there to one row per key by
        :mod:`~airflow_provider_checkpoint.connectors.base.upsert_rule`'s code); more go through Spark; ``0``: never.
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
        if not isinstance(driver_rows, int) or isinstance(driver_rows, bool) or driver_rows < 0:
            raise PipelineDefinitionError(f"{uid}: driver_rows must be an int >= 0, got {driver_rows!r}")
        self.driver_rows = driver_rows
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

    def targets(self) -> list[str]:
        """``postgres://<conn_id>/<schema>.<table>`` of the table, and of the dead-letter table."""
        tables = [(self.schema, self.table_name), *([self.dead_letters] if self.dead_letters else [])]
        return [f"postgres://{self.conn_id}/{schema}.{name}" for schema, name in tables]

    def target_name(self) -> str:
        return f"{self.schema}.{self.table_name} (connection {self.conn_id})"

    record_kind = "postgres"

    def record_target(self) -> str:
        return f"{self.schema}.{self.table_name}"

    def _dead_letters_uid(self) -> str:
        return f"{self.uid}.dead_letters"

    def staged_records(self, grown: Mapping[str, int]) -> dict[str, JsonDict]:
        """Rows staged (no files, no bytes: a table), and with a dead-letter table the rows refused into it."""
        entry = {"kind": self.record_kind, "target": self.record_target(), "files": None, "bytes": None}
        records = {self.uid: {**entry, "rows": int(grown.get("sink_rows", 0))}}
        if self.dead_letters:
            target = ".".join(self.dead_letters)
            refused = int(grown.get("sink_rows_refused", 0))
            records[self._dead_letters_uid()] = {**entry, "kind": "dead_letters", "target": target, "rows": refused}
        return records

    def commit_record(self, checkpoint_id: int) -> dict[str, JsonDict]:
        """The commit time of the marker row (the commit transaction's start), for the table and its dead letters."""
        with self._tx() as db:
            claim = self.owned_claim(claims.read(self, db))
            row = None if claim is None else claims.marker(self, db, claim, checkpoint_id, "committed_at")
        if row is None:
            return {}
        when = {"commit_time": float(row[0])}
        return {self.uid: when, **({self._dead_letters_uid(): when} if self.dead_letters else {})}

    def _connection(self) -> PgConnection:
        return PgConnection.from_airflow(self.conn_id)

    def _tx(self) -> psycopg.Connection[Any]:
        return self._connection().connect()

    def table(self, name: str | None = None) -> Any:
        """This sink's table, or ``name`` in its schema, as a quoted SQL identifier."""
        return pg.ident(self.schema, name or self.table_name)

    # -- bookkeeping tables and claim -------------------------------------------------
    def claim_document(self, job_id: str) -> JsonDict:
        return {"job_id": job_id, "sink": self.uid, "mode": self.mode, "keys": self.keys}

    def load_claim(self) -> JsonDict | None:
        with self._tx() as db:
            return claims.read(self, db)

    def store_claim(self, claim: JsonDict) -> None:  # :meth:`claim` inserts it itself, then reads the winner
        with self._tx() as db:
            claims.insert(self, db, claim)

    def claim(self, job_id: str) -> None:
        """As :meth:`TransactionalSink.claim`, on one connection: the stored claim read; if none, this job's
        inserted (unless another is there by then: ``ON CONFLICT DO NOTHING``), committed and read again, so
        the claim that won is the one checked."""
        self.bind_job(job_id)
        with self._tx() as db:
            stored = claims.read(self, db)
            if stored is None:
                claims.insert(self, db, self.claim_document(job_id))
                db.commit()
                stored = claims.read(self, db)
        if stored is None:
            raise CheckpointStorageError(f"sink {self.uid}: the claim of {self.target_name()} was not stored")
        self.owned_claim(stored)

    def prepare(self, ctx: StepContext) -> None:
        """Before any Spark work of the step: the connection works, the table is this job's."""
        self.claim(ctx.plan.job_id)

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
        held = self.held_input(ctx)
        return self._staged(ctx, df.schema, df if held is None else held)

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
        (:meth:`UpsertRows.collect`: the rule's code, as Spark reduces them) and staged from there.

        Otherwise an input that may repeat a key is first staged as it is, without Spark's reduction to one
        row per key (a shuffle of every row): the staging table then holds each key once, and no row was
        refused, exactly when the reduction would have changed nothing, and that staging stands.
        Otherwise it is staged again, reduced (the rows as :meth:`UpsertRows.frame` gives them). Rows
        the driver holds (a stateful operator merged there) go from the driver, with no Spark job, as in
        :meth:`write`."""
        reduced = rows.collect(self.driver_rows) if rows.source is not None else None
        if reduced is not None:
            return self._staged(ctx, rows.schema, reduced, reduced=rows.reduce)
        held = rows.in_driver.rows() if rows.in_driver is not None else None
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

    # -- committer (finalize / recovery side) ------------------------------------------
    def read_committables(self, checkpoint_id: int, committables: Any, document: str) -> list[staging.Staged]:
        """``[(staging table, rows, dead letters, seal)]``: each table named by this sink's pattern for
        ``checkpoint_id``."""
        return staging.read_committables(self, checkpoint_id, committables, document)

    def verify_staged(self, checkpoint_id: int, committables: list[JsonDict]) -> None:
        """Each staging table still holds the rows the step staged (before ``_metadata``: a table lost
        now aborts the checkpoint, and the next one stages its input again)."""
        document = f"committables of sink {self.uid} for checkpoint {checkpoint_id}"
        with self._tx() as db:
            staging.verify(self, db, checkpoint_id, self.read_committables(checkpoint_id, committables, document))

    def is_committed(self, checkpoint_id: int) -> bool:
        with self._tx() as db:
            return self._marker(db, checkpoint_id) is not None

    def _marker(self, db: psycopg.Connection[Any], checkpoint_id: int, claim: JsonDict | None = None) -> Any:
        claim = claim or self.owned_claim(claims.read(self, db))
        return None if claim is None else claims.marker(self, db, claim, checkpoint_id)

    def _locked_claim(self, db: psycopg.Connection[Any]) -> JsonDict:
        claim = self.owned_claim(claims.read(self, db, lock=True))
        if claim is None:
            raise CheckpointStorageError(f"sink {self.uid}: {self.target_name()} is not claimed by this sink")
        return claim

    def commit_checked(self, checkpoint_id: int, committables: list[staging.Staged]) -> None:
        """The one commit transaction (see the module docstring); a marker already there: nothing."""
        started = time.monotonic()
        with self._tx() as db:
            undo.key_markers_by_table(self, db)
            claim = self._locked_claim(db)
            if self._marker(db, checkpoint_id, claim) is not None:
                return
            rows = 0
            for i, (name, expected, refused, sealed) in enumerate(committables):
                if self.partition_per_checkpoint and i == 0:  # one partition per checkpoint
                    rows += partitions.attach(self, db, checkpoint_id, name, expected, sealed)
                elif i == 0 and target.born_in_commit(self, db):  # the first load makes the table: no copy
                    rows += staging.take_over(self, db, checkpoint_id, name, expected, sealed)
                else:
                    target.follow_staged(self, db, name)
                    columns = [c for c in pg.table_columns(db, self.schema, self.table_name) if c != CHECKPOINT_COLUMN]
                    rows += undo.move_rows(self, db, checkpoint_id, name, expected, columns, sealed)
                dead_letters.move(self, db, claim, checkpoint_id, name, refused)
            fault_point("finalize.inside_sink_commit", checkpoint=checkpoint_id, sink=self.uid)
            undo.write_marker(self, db, claim, checkpoint_id, rows)
            staging.drop(
                self, db, staging.tables(self, db, checkpoint_id)
            )  # the staging tables of the checkpoint's other attempts
        log.info(
            "sink %s: committed checkpoint %d (%d rows) into %s in %.2fs",
            self.uid, checkpoint_id, rows, self.target_name(), time.monotonic() - started,
        )  # fmt: skip

    def rollback(self, checkpoint_id: int) -> None:
        """Return the table to its state when ``checkpoint_id`` committed, in one transaction, and drop
        the staging tables of later checkpoints (the restored job never commits them)."""
        with self._tx() as db:
            if claims.read(self, db) is None:
                return
            claim = self._locked_claim(db)
            if self.partition_per_checkpoint:
                partitions.drop_newer(self, db, checkpoint_id)
            undone = undo.undo_newer(self, db, claim, checkpoint_id)
            dead_letters.delete_newer(self, db, claim, checkpoint_id)
            later = staging.drop(
                self, db, [n for n in staging.tables(self, db) if pg.staged_checkpoint(n) > checkpoint_id]
            )
        if undone or later:
            log.info(
                "sink %s: rolled back checkpoints %s of %s, dropped %d staging tables of later checkpoints",
                self.uid, undone, self.target_name(), later,
            )  # fmt: skip

    def abort(self, checkpoint_id: int) -> None:
        """Drop every attempt's staging table of ``checkpoint_id``. Best effort: when the server cannot
        be reached (the reason a checkpoint often aborts), they stay behind and :meth:`audit` lists them."""
        try:
            with self._tx() as db:
                dropped = staging.drop(self, db, staging.tables(self, db, checkpoint_id))
        except (SinkConnectionError, SinkUnavailableError) as e:
            log.warning("sink %s: staging tables of checkpoint %d not dropped: %s", self.uid, checkpoint_id, e)
            return
        if dropped:
            log.info("sink %s: dropped %d staging tables of checkpoint %d", self.uid, dropped, checkpoint_id)

    def audit(self) -> list[str]:
        with self._tx() as db:
            return [f"staging table left behind: {self.schema}.{name}" for name in staging.tables(self, db)]
