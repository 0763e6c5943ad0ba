"""The committer side of :class:`~.sink.PostgresTableSink` (finalize and the trigger's recovery): the check of the
staging tables before ``_metadata``, the one commit transaction, restore, abort and audit (see :mod:`.sink`)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.connectors.postgres import claims, dead_letters, partitions, staging, target, undo
from airflow_provider_checkpoint.connectors.postgres import sql as pg
from airflow_provider_checkpoint.connectors.postgres.sql import CHECKPOINT_COLUMN
from airflow_provider_checkpoint.connectors.postgres.table import PostgresTableBase
from airflow_provider_checkpoint.core.faults import fault_point
from airflow_provider_checkpoint.core.model import JsonDict
from airflow_provider_checkpoint.exceptions import CheckpointStorageError, SinkConnectionError, SinkUnavailableError

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)


class PostgresCommitter(PostgresTableBase):
    """Commit, restore, abort and audit of :class:`~.sink.PostgresTableSink` (see :mod:`.sink`)."""

    def commit_record(self, checkpoint_id: int) -> dict[str, JsonDict]:
        """The commit time of the marker row (the commit transaction's start), for the table and its dead letters."""
        with self._tx() as db:
            claim = self.owned_claim(claims.read(self, db))
            row = None if claim is None else claims.marker(self, db, claim, checkpoint_id, "committed_at")
        if row is None:
            return {}
        when = {"commit_time": float(row[0])}
        return {self.uid: when, **({self._dead_letters_uid(): when} if self.dead_letters else {})}

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
