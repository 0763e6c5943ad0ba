"""The Delta sink's committer side (finalize, the trigger's recovery, restore, abort, audit).

**One** Delta commit per checkpoint holds its adds (upsert: also its removes and new deletion
vectors) and a ``txn`` action with app id ``airflow-checkpoint:<job>:<sink uid>`` and version
= checkpoint id; a checkpoint whose id is at most the table's ``transaction_version(app id)`` is
not committed again, so a finalize retry and recovery may both commit. Every commit is followed
by a log checkpoint (:data:`.commit.CHECKPOINT_INTERVAL`); in finalize it is written once every sink of the
checkpoint committed (:meth:`DeltaCommitter.commit_then`), beside what waits for that (a slot's advance), with
the deletion of the other attempts' files; a failure of either is retried (:meth:`DeltaCommitter.housekeeping`).
Restore to checkpoint N (:meth:`DeltaCommitter.rollback`) is one ``RESTORE`` commit back to the version N committed.
Each entry point opens the table once (:mod:`.opened`); a commit is written with our own log replay
(:mod:`.commit`), delta-rs is opened only after it, for the log checkpoint.
"""

from __future__ import annotations

import functools
import logging
import posixpath
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from airflow_provider_checkpoint.connectors.delta import commit as delta_commit
from airflow_provider_checkpoint.connectors.delta import log as delta_log
from airflow_provider_checkpoint.connectors.delta.files import (
    DeltaCommit,
    dv_files,
    file_identities,
    kept_files,
    read_delta_committables,
)
from airflow_provider_checkpoint.connectors.delta.log_checks import LogState
from airflow_provider_checkpoint.connectors.delta.table import DeltaTableBase, in_call
from airflow_provider_checkpoint.core.model import JsonDict
from airflow_provider_checkpoint.dataflow.sink import Housekeeping
from airflow_provider_checkpoint.exceptions import DocumentError, RestoreError
from airflow_provider_checkpoint.storage.paths import is_local, refuse_links

if TYPE_CHECKING:
    from deltalake import DeltaTable

log = logging.getLogger(__name__)

_RECENT_COMMITS = 20
"""How many of a table's newest commits :meth:`DeltaCommitter.commit_record` reads before the whole log."""


class DeltaCommitter(DeltaTableBase):
    """Commit, restore, abort and audit of :class:`~.sink.DeltaTableSink` (see the module docstring)."""

    record_kind = "delta"
    _records: dict[int, JsonDict]
    """What this sink committed in this process: checkpoint id → its Delta version and commit time (dropped
    by a restore)."""

    def read_committables(self, checkpoint_id: int, committables: Any, document: str) -> DeltaCommit:
        buckets = self.upsert.buckets if self.upsert else 0
        return read_delta_committables(
            checkpoint_id, committables, self.upsert is not None, self.partition_by, buckets, document
        )

    @in_call
    def commit(self, checkpoint_id: int, committables: list[JsonDict]) -> None:
        super().commit(checkpoint_id, committables)

    @in_call
    def commit_then(self, checkpoint_id: int, committables: list[JsonDict]) -> Housekeeping | None:
        return super().commit_then(checkpoint_id, committables)

    @in_call
    def is_committed(self, checkpoint_id: int) -> bool:
        """Whether the table's ``transaction_version(app id)`` is at least ``checkpoint_id``: from the log
        the check replayed (:class:`.log_checks.LogState`), else from delta-rs."""
        app_id, state = self.app_id(), self._table().state()
        if app_id is None or state is None:
            return False
        if state.replayed:
            version = state.txns.get(app_id)
        else:
            table = self._delta()
            version = table.transaction_version(app_id) if table else None
        return version is not None and version >= checkpoint_id

    @in_call
    def commit_checked(self, checkpoint_id: int, committables: Any) -> Housekeeping:
        """One Delta commit: the adds, the removes, the new DVs and ``txn(app id, checkpoint id)``; retried
        on conflicts with other writers. Every added file must exist with the size its committable names
        (one listing of ``chk-<id>/``), every DV file must exist, every removed file must be in the table.
        Returns its housekeeping: the log checkpoint and the deletion of the attempt's leftovers (the commit
        is durable without them: a reader replays the commits since the last log checkpoint)."""
        commit: DeltaCommit = committables
        opened = self._table()
        app_id, state = self.app_id(), opened.state()
        document = f"committables of sink {self.uid} for checkpoint {checkpoint_id}"
        if app_id is None or state is None:
            raise DocumentError(
                document, "committables", f"name files of {self.asset_uri()}, which nothing staged into"
            )
        staged = self._staged(checkpoint_id)
        for add in commit.adds:
            if staged.get(add.path) != add.size:
                raise DocumentError(document, "adds", f"name a file that is missing or not {add.size} bytes", add.path)
        missing = sorted(f for f in dv_files(commit) if f not in staged)
        if missing:
            raise DocumentError(document, "deletes", "name deletion vector files that do not exist", missing[:5])
        self._refuse_links(checkpoint_id, [a.path for a in commit.adds] + sorted(dv_files(commit)))
        self._check_partitions(state, document)
        started = time.monotonic()
        fs, root = self._fs()
        partition_by = None if self.upsert else self.partition_by
        done = delta_commit.commit(
            fs,
            root,
            self.asset_uri(),
            app_id,
            checkpoint_id,
            commit,
            document,
            state.version,
            partition_by,
            state.files,
        )
        version = done.version if done else None
        if done is not None:  # the version and time the table's history gives it (:meth:`_record`)
            self._records[checkpoint_id] = {"delta_version": done.version, "commit_time": done.timestamp / 1000}
        log.info(
            "sink %s: checkpoint %d committed as Delta version %s (%d adds, %d removes, %d files with new deletes) "
            "in %.3fs",
            self.uid,
            checkpoint_id,
            version,
            len(commit.adds),
            len(commit.removes),
            len(commit.deletes),
            time.monotonic() - started,
        )

        def housekeeping() -> None:  # the log checkpoint (readers' shortcut) and the leftovers: no guarantee's
            if done is not None:
                delta_commit.log_checkpoint(fs, root, self.asset_uri(), done, opened.advance)
            self._delete_all_but(checkpoint_id, {a.path for a in commit.adds} | dv_files(commit), staged)

        return housekeeping

    def housekeeping(self, checkpoint_id: int) -> Housekeeping:
        """The deletion of committed checkpoint ``checkpoint_id``'s leftovers once more (its log checkpoint is
        the next commit's: it checkpoints the whole log)."""
        return functools.partial(self._delete_leftovers, checkpoint_id)

    @in_call
    def _delete_leftovers(self, checkpoint_id: int) -> None:
        """Delete every file under ``chk-<id>/`` that the version committing ``checkpoint_id`` does not reference,
        as its history tells (nothing when it does not tell: the log no longer holds the commit)."""
        version = self.committed_versions().get(checkpoint_id)
        if version is None:
            log.info(
                "sink %s: no commit of checkpoint %d in the Delta log: its files are kept", self.uid, checkpoint_id
            )
            return
        self._delete_all_but(checkpoint_id, kept_files(self._files(version)))

    def _refuse_links(self, checkpoint_id: int, paths: list[str]) -> None:
        """Refuse a staged data or DV file (table-relative ``paths``) that is a link or is reached through one
        below ``chk-<id>/``, wherever it leads: the commit names only files the steps wrote."""
        location = self.table()
        files = [location.path(p) for p in paths]
        refuse_links(location.fs, location.path(f"chk-{checkpoint_id}"), files, f"staged file of sink {self.uid}")

    def _check_partitions(self, state: LogState, document: str) -> None:
        """The table's partition columns are the sink's (the step checked them and the input's columns
        against the table's, :meth:`.sink.DeltaTableSink._check_input`): from the ``metaData`` the log check
        replayed, else from delta-rs."""
        metadata = state.metadata if state.replayed else None
        columns = metadata.get("partitionColumns") if metadata is not None else None
        if not isinstance(columns, list):
            table = self._delta()
            columns = list(table.metadata().partition_columns) if table is not None else []
        if columns != self.partition_by:
            raise DocumentError(
                document,
                "adds",
                f"are partitioned by {self.partition_by}, the Delta table {self.asset_uri()} by {columns}",
            )

    def describe_commit(self, checkpoint_id: int) -> JsonDict:
        version = self.commit_record(checkpoint_id).get(self.uid, {}).get("delta_version")
        return {} if version is None else {"delta_version": version}

    @in_call
    def commit_record(self, checkpoint_id: int) -> dict[str, JsonDict]:
        """The Delta version that committed ``checkpoint_id`` and its commit time, from the table's history:
        its newest commits first (the record is written just after the commit), the whole log if need be.
        A version this process committed is known without a read."""
        app_id = self.app_id()
        if app_id is None:
            return {}
        if self._records.get(checkpoint_id):
            return {self.uid: dict(self._records[checkpoint_id])}
        table = self._table().whole_log()
        if table is None:
            return {}
        for limit in (_RECENT_COMMITS, None):
            if record := self._record(table, app_id, checkpoint_id, limit):
                return {self.uid: record}
        return {}

    @staticmethod
    def _record(table: DeltaTable, app_id: str, checkpoint_id: int, limit: int | None) -> JsonDict:
        """The version and commit time of ``checkpoint_id``'s commit among the ``limit`` newest; ``{}``."""
        for entry in table.history(limit):
            if entry.get("checkpoint_app_id") != app_id or entry.get("operation") == "RESTORE":
                continue
            if entry.get("checkpoint_id") == checkpoint_id and type(entry.get("version")) is int:
                stamp = entry.get("timestamp")
                when = stamp / 1000 if type(stamp) is int and stamp >= 0 else None
                return {"delta_version": entry["version"], "commit_time": when}
        return {}

    @in_call
    def rollback(self, checkpoint_id: int) -> None:
        """Return the table to the version checkpoint ``checkpoint_id`` committed, in one ``RESTORE`` commit.

        Undoes every later commit (of any writer); a no-op when the table already holds
        exactly that version's files. Refused if the version is not in the log any more.
        """
        from deltalake import CommitProperties
        from deltalake.exceptions import DeltaError

        self._records = {}
        table = self._table().whole_log()
        app_id = self.app_id()
        if table is None or app_id is None or (table.transaction_version(app_id) or 0) <= checkpoint_id:
            return
        versions = self.committed_versions()
        version = versions.get(checkpoint_id)
        if version is None:
            raise RestoreError(
                f"Delta table {self.asset_uri()} has no commit of checkpoint {checkpoint_id} in its log "
                f"(it has checkpoints {sorted(versions)}): cannot return the table to it"
            )
        if file_identities(self._files()) == file_identities(self._files(version)):
            return
        metadata = {"checkpoint_app_id": app_id, "restored_checkpoint": checkpoint_id}
        try:
            table.restore(version, commit_properties=CommitProperties(custom_metadata=metadata))
        except (DeltaError, OSError) as e:  # e.g. the version's files were vacuumed
            raise RestoreError(
                f"Delta table {self.asset_uri()} cannot return to version {version} (checkpoint {checkpoint_id}): {e}"
            ) from e
        log.info("sink %s: Delta table restored to version %d (checkpoint %d)", self.uid, version, checkpoint_id)

    def _staged(self, checkpoint_id: int) -> dict[str, int]:
        """The files under ``chk-<id>/`` (table-relative) and their sizes: one listing."""
        location = self.table()
        try:
            found = location.fs.find(location.path(f"chk-{checkpoint_id}"), detail=True)
        except FileNotFoundError:
            return {}
        return {location.relative(path): int(info.get("size") or 0) for path, info in found.items()}

    def _leftovers(self, checkpoint_id: int, staged: dict[str, int], kept: set[str] | None = None) -> list[str]:
        """The ``staged`` files of ``checkpoint_id`` not in ``kept`` (default: what its commit added)."""
        if kept is None and staged:
            version = self.committed_versions().get(checkpoint_id)
            kept = kept_files(self._files(version)) if version is not None else set()
        return [p for p in staged if p not in (kept or set())]

    def _delete_all_but(
        self, checkpoint_id: int, kept: set[str] | None = None, staged: dict[str, int] | None = None
    ) -> None:
        location = self.table()
        staged = self._staged(checkpoint_id) if staged is None else staged
        leftovers = self._leftovers(checkpoint_id, staged, kept)
        location.delete_files(leftovers)
        prefix = f"chk-{checkpoint_id}"
        if is_local(location.fs) and len(leftovers) == len(staged) and location.exists(prefix):
            location.delete(prefix)  # an object store has no empty directories

    @in_call
    def abort(self, checkpoint_id: int) -> None:
        """Delete every file of ``checkpoint_id`` its commit (if any) did not add: other and aborted attempts."""
        self._delete_all_but(checkpoint_id)

    @in_call
    def audit(self) -> list[str]:
        """Files under ``chk-<id>/`` that checkpoint's commit did not add, files the log no longer
        references beyond the table's ``delta.deletedFileRetentionDuration`` (a ``VACUUM`` deletes them),
        and commits of an upsert table that removed and re-added a file with the same deletion vector."""
        fs, root = self._fs()
        table, location = self._table().whole_log(), self.table()
        if table is None:
            return []
        names = [posixpath.basename(p.rstrip("/")) for p in fs.ls(root, detail=False)]
        ids = sorted(int(n[4:]) for n in names if n.startswith("chk-") and n[4:].isdigit())
        leftovers = [location.url(p) for i in ids for p in self._leftovers(i, self._staged(i))]
        expired = [location.url(p) for p in map(unquote, table.vacuum(dry_run=True)) if location.exists(p)]
        return (
            [f"unreferenced sink file left behind: {u}" for u in leftovers]
            + [
                f"file the Delta log no longer references beyond its retention (VACUUM deletes it): {u}"
                for u in expired
                if u not in leftovers
            ]
            + (self._same_dv_findings() if self.upsert else [])
        )

    def _same_dv_findings(self) -> list[str]:
        """Files live in the order of the log's commit files that readers drop, as a commit removed and
        re-added them with the same deletion vector (issue #30), and the checkpoint to restore the job to."""
        fs, root = self._fs()
        table = self.asset_uri()
        live = delta_log.live_actions(fs, root, table, in_order=True)
        lost = sorted(live.keys() - delta_log.live_actions(fs, root, table).keys())
        ours = self.committed_versions() if lost else {}
        findings = []
        for key in lost:
            path, since = key[0], live[key][0]
            before = [c for c, v in ours.items() if v < since]
            way = f"restore the job to checkpoint {max(before)} or earlier" if before else "rewrite the table"
            findings.append(
                f"Delta version {since} removes and re-adds {self.table().url(path)} with the same deletion "
                f"vector (issue #30): readers dropped that file's rows; {way} to repair it "
                "(docs/delta-lake.md, 'Tables written before the fix')"
            )
        return findings
