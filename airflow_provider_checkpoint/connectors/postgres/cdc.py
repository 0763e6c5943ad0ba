"""PostgresCdcSource: a PostgreSQL database's row changes through a logical replication slot (pgoutput);
the barrier is a WAL position (LSN)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.connectors.postgres import (
    cdc_chunks,
    cdc_driver,
    cdc_publication,
    cdc_schema,
    cdc_slot,
)
from airflow_provider_checkpoint.connectors.postgres.cdc_rows import (
    DELETED,
    METADATA_DDL,
    check_tables,
    from_parquet,
    merged_columns,
    parquet,
)
from airflow_provider_checkpoint.connectors.postgres.cdc_snapshot import copy_rows, server_lost
from airflow_provider_checkpoint.connectors.postgres.cdc_types import (
    SESSION,
    TableColumn,
    table_columns,
)
from airflow_provider_checkpoint.connectors.postgres.connection import PgConnection
from airflow_provider_checkpoint.connectors.postgres.pgoutput import int_to_lsn, lsn_to_int
from airflow_provider_checkpoint.connectors.postgres.pgoutput_columns import decode_rows
from airflow_provider_checkpoint.core.documents import JsonDict
from airflow_provider_checkpoint.dataflow.graph import Source
from airflow_provider_checkpoint.dataflow.source import Release
from airflow_provider_checkpoint.exceptions import CdcSourceError, InvalidPositionError, PipelineDefinitionError
from airflow_provider_checkpoint.fileio.frames import arrow_frame
from airflow_provider_checkpoint.storage.job_storage import SOURCES_DIR

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from airflow_provider_checkpoint.dataflow.context import StepContext
    from airflow_provider_checkpoint.dataflow.driver_rows import SourceRows
    from airflow_provider_checkpoint.storage import JobStorage

log = logging.getLogger(__name__)

SLOT_MARKER = SOURCES_DIR + "/{uid}/slot.json"
"""In the job's storage: the slot the source created (written first), so that only our own slot is ever dropped."""


class PostgresCdcSource(Source):
    """Every committed row change of PostgreSQL tables, exactly once per completed checkpoint, through an
    Airflow ``postgres`` connection (``postgres_conn_id``) whose user may replicate (``REPLICATION`` or a
    superuser) and read the tables; the server runs with ``wal_level=logical``.

    **Tables**: ``tables`` (a list; the job creates publication ``publication``, by default named after the
    slot, for them) or ``publication`` alone (an existing publication: its tables). **The slot**: the job's
    first checkpoint creates logical replication slot ``slot_name`` (default ``ckpt_<job>_<uid>``) with the
    pgoutput plugin and an exported snapshot, and reads every table in that snapshot: the first checkpoint
    holds every row then present (``op`` insert), consistent with the slot, so no change is lost or doubled
    at the handover.

    **The barrier** is the server's WAL flush position (LSN) at trigger time. A checkpoint holds exactly the
    transactions whose commit record lies in ``[previous position, barrier)``, each whole, in commit order;
    a transaction still open at the barrier belongs to a later checkpoint. A step peeks the slot (the slot
    never moves while reading); once a checkpoint completes, the slot is advanced to the oldest position a
    retained checkpoint holds, so the WAL every restorable checkpoint needs stays on the server.

    **Rows**: the tables' columns (typed from the catalog; see :mod:`.cdc_types` for the types converted,
    others are refused naming the column) and :data:`METADATA`: ``source_table`` (``schema.name``), ``op``
    (insert, update, delete), ``deleted`` (``op = 'delete'``: give it to an upsert sink as ``delete_when``),
    ``lsn`` (the transaction's commit LSN), ``commit_time`` and ``xid``. A delete carries the key columns
    (the whole old row under ``REPLICA IDENTITY FULL``). An update that leaves a TOASTed value unchanged
    needs ``REPLICA IDENTITY FULL`` on its table (else it is refused, naming the table). Schema changes are
    followed as :mod:`.cdc_schema` says (columns added, dropped ones kept, types widened; others refused).
    TRUNCATE and a dropped, invalidated or released slot are refused with the way on, never skipped.

    **To a sink that takes rows on the driver** (the only consumer: a ``DeltaTableSink`` or ``ParquetTableSink``
    upsert merged there, a ``PostgresTableSink``), a checkpoint of at most ``driver_read_bytes`` of WAL (256 MiB;
    ``0``: never) goes without Spark (:mod:`.cdc_driver`).
    """

    def __init__(
        self,
        uid: str,
        tables: Sequence[str] | None = None,
        *,
        publication: str | None = None,
        postgres_conn_id: str = "postgres_default",
        slot_name: str | None = None,
        watermark: tuple[str, str] | None = None,
        snapshot_chunk_rows: int | None = None,
        driver_read_bytes: int = cdc_driver.DRIVER_READ_BYTES,
    ) -> None:
        super().__init__(uid, watermark)
        self.driver_read_bytes = cdc_driver.checked_bytes(uid, driver_read_bytes)
        if snapshot_chunk_rows is not None and (
            not isinstance(snapshot_chunk_rows, int) or isinstance(snapshot_chunk_rows, bool) or snapshot_chunk_rows < 1
        ):
            raise PipelineDefinitionError(
                f"{uid}: snapshot_chunk_rows must be a positive int, got {snapshot_chunk_rows!r}"
            )
        self.snapshot_chunk_rows = snapshot_chunk_rows
        if tables is None and publication is None:
            raise PipelineDefinitionError(f"{uid}: give tables, or the publication that lists them")
        if tables is not None:
            tables = [tables] if isinstance(tables, str) else list(tables)
            if not tables:
                raise PipelineDefinitionError(f"{uid}: tables is empty")
        for name, value in (("publication", publication), ("slot_name", slot_name)):
            if value is not None and not re.fullmatch(r"[a-z0-9_]{1,63}", value):
                raise PipelineDefinitionError(f"{uid}: {name} must be 1-63 of a-z, 0-9 and _, got {value!r}")
        self.tables = None if tables is None else sorted({cdc_publication.qualified(uid, t) for t in tables})
        self.publication, self.slot_name = publication, slot_name
        self.postgres_conn_id = postgres_conn_id
        self.job_storage: JobStorage | None = None
        """The job's storage, once bound: the first barrier writes the snapshot there."""

    def bind_storage(self, storage: JobStorage) -> None:
        self.job_storage = storage

    def deletes_column(self) -> str | None:
        return DELETED

    def added_columns(self) -> str:
        return METADATA_DDL

    def describe(self) -> JsonDict:
        return {**super().describe(), "tables": self.tables, "publication": self.publication}

    def to_spec(self) -> JsonDict:
        return {
            "uid": self.uid,
            "tables": self.tables,
            "publication": self.publication,
            "postgres_conn_id": self.postgres_conn_id,
            "slot_name": self.slot_name,
            "snapshot_chunk_rows": self.snapshot_chunk_rows,
            "driver_read_bytes": self.driver_read_bytes,
        }

    # -- positions (the trigger, no Spark) ---------------------------------------------------
    def _pg(self) -> PgConnection:
        return PgConnection.from_airflow(self.postgres_conn_id)

    def _default_slot(self) -> str:
        job = self.job_storage.job_id if self.job_storage else "job"
        return re.sub(r"[^a-z0-9_]", "_", f"ckpt_{job}_{self.uid}".lower())[:63]

    def initial_position(self) -> None:
        """No position: the first barrier creates the slot and takes the snapshot."""
        return None

    def _position(self, value: Any, what: str) -> tuple[str, str, int]:
        try:
            return str(value["slot"]), str(value["publication"]), lsn_to_int(value["lsn"])
        except (TypeError, KeyError, ValueError) as e:
            raise InvalidPositionError(f"source {self.uid}: {what} {value!r} is not a CDC position") from e

    def _captured(self, value: Any) -> list[str]:
        """The tables a position's snapshot covered (validated as :meth:`_position`)."""
        tables = value.get("tables") if isinstance(value, dict) else None
        if not isinstance(tables, list) or not all(isinstance(t, str) for t in tables):
            raise InvalidPositionError(f"source {self.uid}: position {value!r} does not list its tables")
        return [str(t) for t in tables]

    def new_input(self, previous: Any) -> bool:
        if previous is None or (isinstance(previous, dict) and previous.get("snapshot_cursor") is not None):
            return True
        slot, _, lsn = self._position(previous, "position")
        with self._pg().connect(autocommit=True) as conn:
            return cdc_slot.flush_lsn(conn) > lsn

    def barrier_position(self, previous: Any) -> JsonDict:
        """The WAL flush position now; at the job's first barrier, the slot's consistent point, with the
        snapshot it exported read into the job's storage (the first checkpoint's input)."""
        if previous is None:
            return self._first_chunk() if self.snapshot_chunk_rows else self._snapshot()
        slot, publication, lsn = self._position(previous, "position")
        captured = self._captured(previous)
        with self._pg().connect(autocommit=True) as conn:
            cdc_slot.check(conn, self.uid, slot, lsn)
            now = cdc_publication.published(conn, self.uid, publication)
            cdc_publication.check_unchanged(self.uid, now, captured, self.tables)
            barrier = max(cdc_slot.flush_lsn(conn), lsn)
            columns = self._recorded(previous, conn)
            # read after the barrier: a DDL committed in between shows a step early, harmless (columns only grow)
            evolved = {
                t: cdc_schema.evolve(self.uid, columns[t], table_columns(conn, t), cdc_schema.prefilled(conn, t))
                for t in captured
            }
        position: JsonDict = {"slot": slot, "publication": publication, "lsn": int_to_lsn(barrier), "tables": captured}
        position["columns"] = {t: cdc_schema.to_json(c) for t, c in evolved.items()}
        cursor = cdc_chunks.parse_cursor(self.uid, previous.get("snapshot_cursor"), captured)
        return position if cursor is None else self._next_chunk(position, cursor)

    def _recorded(self, position: Any, conn: Any) -> dict[str, list[TableColumn]]:
        """The columns of each table a position records (a position written before columns were recorded:
        the catalog's now)."""
        recorded = position.get("columns")
        if recorded is None:
            return {t: table_columns(conn, t) for t in self._captured(position)}
        if not isinstance(recorded, dict):
            raise InvalidPositionError(f"source {self.uid}: position {position!r} records no columns")
        return {t: cdc_schema.from_json(self.uid, t, recorded.get(t)) for t in self._captured(position)}

    def _storage(self) -> JobStorage:
        if self.job_storage is None:
            raise RuntimeError(f"source {self.uid} has no job storage bound (bind_storage)")
        return self.job_storage

    def _prepare(self) -> tuple[str, str, list[str]]:
        """The first barrier's preliminaries: the tables checked, the publication created (or checked), a slot
        of ours left by a first checkpoint that never completed dropped, with its files, and the slot's name
        recorded; the slot, the publication and its tables."""
        storage, slot = self._storage(), self.slot_name or self._default_slot()
        publication = self.publication or slot
        owned = storage.read_if_present(SLOT_MARKER.format(uid=self.uid))
        with self._pg().connect(autocommit=True) as conn:
            tables = self.tables or cdc_publication.published(conn, self.uid, publication)
            if self.snapshot_chunk_rows:
                for table in tables:
                    cdc_chunks.primary_key(conn, self.uid, table)
            check_tables(self.uid, conn, tables)
            cdc_publication.ensure(conn, self.uid, publication, self.tables)
            tables = cdc_publication.published(conn, self.uid, publication)
            if cdc_slot.state(conn, slot) is not None:
                if owned is None or json.loads(owned).get("slot") != slot:
                    raise CdcSourceError(
                        f"source {self.uid}: replication slot {slot} exists and this job did not create it (another "
                        f"job may read it); give the source another slot_name, or drop the slot if nobody needs it: "
                        f"SELECT pg_drop_replication_slot('{slot}')"
                    )
                cdc_slot.drop(conn, slot)  # ours, left by a first checkpoint that never completed
        storage.delete(f"{SOURCES_DIR}/{self.uid}")  # that checkpoint's snapshot files
        storage.write_atomic(SLOT_MARKER.format(uid=self.uid), json.dumps({"slot": slot}).encode())
        return slot, publication, tables

    def _first_chunk(self) -> JsonDict:
        """The chunked snapshot's first barrier: a slot without an exported snapshot, its consistent point the
        position, and the first table's first chunk."""
        slot, publication, tables = self._prepare()
        with self._pg().connect(autocommit=True) as conn:
            consistent = cdc_slot.create(conn, slot)
            recorded = {t: cdc_schema.to_json(table_columns(conn, t)) for t in tables}
        log.info("source %s: slot %s created at %s (chunked snapshot)", self.uid, slot, int_to_lsn(consistent))
        position = {"slot": slot, "publication": publication, "lsn": int_to_lsn(consistent), "tables": tables}
        return self._next_chunk({**position, "columns": recorded}, cdc_chunks.Cursor(tables[0], None))

    def _next_chunk(self, position: JsonDict, cursor: cdc_chunks.Cursor) -> JsonDict:
        rows = self.snapshot_chunk_rows or cdc_chunks.DEFAULT_CHUNK_ROWS
        return cdc_chunks.next_chunk(self._pg(), self._storage(), self.uid, position, cursor, rows)

    def _snapshot(self) -> JsonDict:
        slot, publication, tables = self._prepare()
        pg = self._pg()
        with (
            server_lost(self.uid, slot, tables),
            pg.connect(autocommit=True, replication=True) as replication,
            pg.connect() as conn,
        ):
            consistent, snapshot = cdc_slot.create_with_snapshot(replication, slot)
            storage = self._storage()
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            conn.execute(f"SET TRANSACTION SNAPSHOT '{snapshot}'")
            conn.execute(SESSION)
            directory = f"{SOURCES_DIR}/{self.uid}/snapshot-{consistent:016x}"
            files, rows, recorded = [], 0, {}
            for i, table in enumerate(tables):
                columns = table_columns(conn, table)
                recorded[table] = cdc_schema.to_json(columns)
                data = copy_rows(conn, self.uid, table, columns, consistent)
                files.append(f"{directory}/{i}.parquet")
                rows += data.num_rows
                storage.write_atomic(files[-1], parquet(data))
            conn.rollback()
        log.info(
            "source %s: slot %s created at %s; snapshot of %d table(s), %d row(s)",
            self.uid,
            slot,
            int_to_lsn(consistent),
            len(tables),
            rows,
        )
        position = {"slot": slot, "publication": publication, "lsn": int_to_lsn(consistent), "tables": tables}
        return {**position, "columns": recorded, "snapshot": files}

    # -- after completion ----------------------------------------------------------------------
    def on_checkpoint_committed(self, checkpoint_id: int, position: Any) -> None:
        """The snapshot's files the checkpoint read (the first one's, or a chunk's) are read: delete them
        (idempotent)."""
        if not isinstance(position, dict) or self.job_storage is None:
            return
        if position.get("snapshot"):
            self.job_storage.delete_files(position["snapshot"])
        if position.get("chunk") is not None:
            self.job_storage.delete_files([cdc_chunks.parse_chunk(self.uid, position["chunk"]).file])

    def release_input(self, positions: Sequence[Any]) -> Release | None:
        """Advancing the slot to the oldest of ``positions`` (those of the completed checkpoints a restore may
        still start from) once allowed: WAL no restore needs is freed. It connects at once (beside the sinks'
        commits), then waits to be allowed."""
        ours = [self._position(p, "position") for p in positions if p is not None]
        if not ours:
            return None
        slot = ours[-1][0]  # the newest checkpoint's slot (an older one may have read another, dropped since)
        oldest = min(lsn for name, _, lsn in ours if name == slot)
        try:
            pg = self._pg()  # on the finalize's own thread: Airflow is asked here only
        except Exception as e:
            log.warning("source %s: slot %s not advanced to %s: %s", self.uid, slot, int_to_lsn(oldest), e)
            return None

        def advance(allowed: Callable[[], bool]) -> None:
            try:
                with pg.connect(autocommit=True) as conn:
                    if allowed() and cdc_slot.advance(conn, slot, oldest):
                        log.info("source %s: slot %s advanced to %s", self.uid, slot, int_to_lsn(oldest))
            except Exception as e:  # only WAL is kept longer: the next completed checkpoint advances it
                log.warning("source %s: slot %s not advanced to %s: %s", self.uid, slot, int_to_lsn(oldest), e)

        return advance

    # -- reading (the step) --------------------------------------------------------------------
    def read(self, ctx: StepContext, previous: Any, barrier: Any) -> DataFrame:
        return self._frame(ctx, self._rows(ctx, previous, barrier))

    def _frame(self, ctx: StepContext, data: pa.Table) -> DataFrame:
        df = arrow_frame(ctx.spark, data)
        return (df.coalesce(1) if self.in_source_order else df).cache()

    def may_read_in_driver(self, previous: Any, barrier: Any) -> bool:
        """A stream checkpoint spanning at most ``driver_read_bytes`` of WAL; not the snapshot, a chunk or more
        WAL (Spark reads those: the step's task starts it at once)."""
        if previous is None or (isinstance(barrier, dict) and {"snapshot", "chunk"} & barrier.keys()):
            return False
        wal: int = self._position(barrier, "barrier")[2] - self._position(previous, "position")[2]
        return wal <= self.driver_read_bytes

    def read_in_driver(self, ctx: StepContext, previous: Any, barrier: Any) -> SourceRows | None:
        """A stream checkpoint :meth:`may_read_in_driver` takes: its rows as :meth:`read` gives them, kept on
        the driver (:mod:`.cdc_driver`); ``None`` (the snapshot, a chunk, more WAL): Spark."""
        if not self.may_read_in_driver(previous, barrier):
            return None
        data = self._rows(ctx, previous, barrier)
        return cdc_driver.source_rows(ctx.session.conf, data, lambda: self._frame(ctx, data))

    def _rows(self, ctx: StepContext, previous: Any, barrier: Any) -> pa.Table:
        slot, publication, end = self._position(barrier, "barrier")
        if "snapshot" in barrier:
            with self._pg().connect() as conn:
                columns = merged_columns(self.uid, self._recorded(barrier, conn))
            data = from_parquet(columns, (ctx.storage.read_bytes(f) for f in barrier["snapshot"]))
        elif "chunk" in barrier:
            import pyarrow as pa  # the changes its snapshot sees, the chunk, the others (cdc_chunks)

            chunk = cdc_chunks.parse_chunk(self.uid, barrier["chunk"])
            with self._pg().connect() as conn:
                columns = merged_columns(self.uid, self._recorded(barrier, conn))
            rows = from_parquet(columns, [ctx.storage.read_bytes(chunk.file)])
            if previous is None:
                data = rows
            else:
                _, _, start = self._position(previous, "position")
                seen, unseen = self._changes(slot, publication, barrier, (start, end), chunk.snapshot)
                data = pa.concat_tables([seen, rows, unseen])
        else:
            _, _, start = self._position(previous, "position")
            (data,) = self._changes(slot, publication, barrier, (start, end))
        log.info("source %s: %d change(s) in [%s, %s)", self.uid, data.num_rows, previous and previous["lsn"], end)
        return data

    def _changes(
        self, slot: str, publication: str, barrier: Any, span: tuple[int, int], seen: cdc_chunks.Snapshot | None = None
    ) -> list[pa.Table]:
        """The changes of the transactions committed in ``span`` (``[start, end)``), as rows of the columns
        ``barrier`` records: one table, or with ``seen``, two: those of the transactions ``seen`` sees, then
        the others."""
        start, end = span
        with self._pg().connect() as conn:
            conn.execute(SESSION)
            found = cdc_slot.check(conn, self.uid, slot, start)
            recorded = self._recorded(barrier, conn)
            columns = merged_columns(self.uid, recorded)
            catalog = {t: {c.name: c for c in table} for t, table in recorded.items()}
            messages = cdc_slot.peek(conn, slot, publication, end, found)
            conn.close()  # read only: the server ends the transaction as the connection closes, not waited for
        return decode_rows(self.uid, slot, messages, columns, catalog, span, None if seen is None else seen.sees)
