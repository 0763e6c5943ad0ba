"""An exactly-once Delta Lake table written with delta-rs (``deltalake``; no JVM connector).

Writer (the step): Spark's executors write the checkpoint's Parquet files straight into the
table directory under ``chk-<id>/<job>/<step>/attempt-<n>/``, names no log entry has; the
committables are their file actions (path, size, records, partition values), validated on
read (:mod:`.delta_files`).

Upsert (:mod:`.upsert`) is merge-on-read: the changed rows go to new files and the
rows they replace are deleted with deletion vectors, so its cost grows with the changed
keys; its commit is written by :mod:`.commit` (delta-rs's API has no DVs).

Committer (finalize, recovery): **one** Delta commit per checkpoint holds its adds (upsert:
also its removes and new deletion vectors) and a ``txn`` action with app id
``airflow-checkpoint:<job>:<sink uid>`` and version = checkpoint id. A checkpoint whose id
is at most the table's ``transaction_version(app id)`` is not committed again. Readers of
the log (delta-rs, DuckDB, Spark with Delta) see whole checkpoints only. Restore to
checkpoint N (:meth:`DeltaTableSink.rollback`) is one ``RESTORE`` commit back to the version
N committed. The claim (job, sink, layout) lives in ``_table.json`` beside ``_delta_log``.
"""

from __future__ import annotations

import logging
import posixpath
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from airflow_provider_checkpoint.connectors.base.bucketed import DRIVER_MERGE_ROWS, BucketedUpsert, bucket_file
from airflow_provider_checkpoint.connectors.base.sink import CLAIM_FILE, TableDirectorySink, check_mode
from airflow_provider_checkpoint.connectors.base.upsert_rule import UpsertRows, check_sequence_by
from airflow_provider_checkpoint.connectors.delta import commit as delta_commit
from airflow_provider_checkpoint.connectors.delta import log as delta_log
from airflow_provider_checkpoint.connectors.delta import storage as delta_storage
from airflow_provider_checkpoint.connectors.delta import upsert as delta_upsert
from airflow_provider_checkpoint.connectors.delta.files import (
    DeltaCommit,
    DeltaFile,
    check_input_columns,
    dv_files,
    file_identities,
    is_upsert_file,
    kept_files,
    read_delta_committables,
)
from airflow_provider_checkpoint.connectors.delta.log import LOG_DIR, DataFile
from airflow_provider_checkpoint.core.documents import Fields
from airflow_provider_checkpoint.core.model import JsonDict
from airflow_provider_checkpoint.dataflow.graph import Node
from airflow_provider_checkpoint.exceptions import (
    DocumentError,
    PipelineDefinitionError,
    RestoreError,
    SinkClaimedError,
    SinkSchemaError,
)
from airflow_provider_checkpoint.fileio.writes import write_parquet

if TYPE_CHECKING:
    import fsspec
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame

    from airflow_provider_checkpoint.dataflow.context import StepContext

log = logging.getLogger(__name__)

_LOG_DAMAGE = ("Kernel error", "Invalid", "JSON", "Parquet error", "Arrow error", "Protocol")
"""Words of delta-rs errors about the log's content (not its storage)."""

FORMAT = "delta_table"
_DV_PROPERTY = "delta.enableDeletionVectors"
_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
_RECENT_COMMITS = 20
"""How many of a table's newest commits :meth:`DeltaTableSink.commit_record` reads before the whole log."""


class DeltaTableSink(TableDirectorySink):
    """Exactly-once Delta table in ``append`` or ``upsert`` (by ``keys``) mode; one commit per checkpoint.

    ``upsert`` writes the first load into ``buckets`` files hashed by ``keys``; later
    checkpoints write their changed rows as new files and delete the replaced rows with
    deletion vectors (readers must apply them: delta-rs ``scan()``, DuckDB, Spark with
    Delta): cost grows with the changed keys, not the table. ``partition_by`` is for
    ``append`` tables. The input's columns must equal the table's (no automatic schema evolution).

    :param uid: Unique id of the sink in the pipeline.
    :param input: The node whose records the table receives.
    :param path: The table directory (a local path or URL delta-rs and fsspec both read).
    :param mode: ``"append"`` or ``"upsert"``.
    :param keys: The key columns of an upsert table.
    :param partition_by: Partition columns of an append table (created with them).
    :param buckets: Number of bucket files of an upsert table's first load (1 to 4096; fixed once written).
    :param driver_merge_rows: An upsert of at most this many input rows is collected in one Spark job and
        written by the driver (pyarrow): a first load bucketed, a later checkpoint's update file; ``0``: Spark.
    :param storage_options: Options of the table's storage: ``s3fs``'s, or an Airflow ``aws`` connection as
        ``conn_id``; delta-rs's are derived from them (:mod:`.storage`).
    :param step: Name of the step (Airflow task) the sink runs in.
    :param sequence_by: Upsert mode: the column(s) that order several rows of one key in a
        checkpoint, greatest wins; ``None``: the later row in source order (:mod:`.upsert_rule`).
    """

    def __init__(
        self,
        uid: str,
        input: Node,
        path: str,
        mode: str = "append",
        keys: list[str] | None = None,
        partition_by: list[str] | None = None,
        buckets: int = 16,
        driver_merge_rows: int = DRIVER_MERGE_ROWS,
        storage_options: dict[str, Any] | None = None,
        step: str | None = None,
        sequence_by: list[str] | None = None,
    ) -> None:
        fsspec_options, self.delta_only = delta_storage.split_options(storage_options)
        super().__init__(uid, input, path, fsspec_options, step)
        check_mode(uid, mode)
        if mode == "upsert" and partition_by:
            raise PipelineDefinitionError(f"{uid}: partition_by is for append mode; upsert buckets by keys")
        self.mode = mode
        self.keys = list(keys or [])
        self.sequence_by = check_sequence_by(uid, mode, self.keys, sequence_by)
        self.partition_by = list(partition_by or [])
        self.upsert = BucketedUpsert(uid, self.keys, buckets, driver_merge_rows) if mode == "upsert" else None

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "format": FORMAT, "path": self.path, "mode": self.mode, "keys": self.keys}

    def claim_document(self, job_id: str) -> JsonDict:
        claim = {**super().claim_document(job_id), "format": FORMAT, "mode": self.mode, "keys": self.keys}
        return {**claim, "buckets": self.upsert.buckets} if self.upsert else claim

    # -- the table -----------------------------------------------------------------------
    def _delta(self) -> DeltaTable | None:
        """The Delta table's latest version, ``None`` if there is no table yet."""
        from deltalake import DeltaTable

        fs, root = self._fs()
        delta_storage.check_table(fs, root, self.asset_uri())
        return self._load() if DeltaTable.is_deltatable(self.asset_uri(), self.delta_options()) else None

    def delta_options(self) -> dict[str, str]:
        """delta-rs's options reaching the table as its filesystem does (:mod:`.storage`)."""
        return delta_storage.delta_rs_options(self._fs()[0], self.storage_options, self.delta_only)

    def _open(self, version: int | None = None) -> DeltaTable:
        fs, root = self._fs()
        delta_storage.check_table(fs, root, self.asset_uri())
        return self._load(version)

    def _load(self, version: int | None = None) -> DeltaTable:
        """delta-rs's table (checked first by the caller); a log delta-rs cannot read is a :class:`DocumentError`
        naming the table (its storage failing stays delta-rs's error, so the task is retried)."""
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError

        try:
            return DeltaTable(self.asset_uri(), version=version, storage_options=self.delta_options())
        except DeltaError as e:
            message = str(e)
            if not any(m in message for m in _LOG_DAMAGE):
                raise
            raise DocumentError(
                f"Delta table {self.asset_uri()}",
                LOG_DIR,
                f"cannot be read by delta-rs ({message[:300]}): a commit, checkpoint or _last_checkpoint file "
                "is damaged; restore it, or restore the job to a checkpoint on a new table path",
            ) from None

    def app_id(self) -> str | None:
        """The ``txn`` app id of this (bound job, sink); ``None`` before the first stage (no claim yet).
        A claim naming another job or sink is refused (:meth:`owned_claim`)."""
        if self.owned_claim(self.load_claim()) is None:
            return None
        return f"airflow-checkpoint:{self.job_id}:{self.uid}"

    def check_target(self) -> None:
        """Refuse a directory that holds anything but a Delta table (and this sink's claim and files)."""
        fs, root = self._fs()
        if not fs.exists(root) or self._delta() is not None:
            return
        foreign = sorted(
            name
            for name in (posixpath.basename(p.rstrip("/")) for p in fs.ls(root, detail=False))
            if name != CLAIM_FILE and not name.startswith("chk-")
        )
        if foreign:
            raise SinkSchemaError(f"{self.asset_uri()} is not a Delta table (no _delta_log) but holds {foreign[:5]}")

    # -- writer (in the step) ------------------------------------------------------------
    def write(self, ctx: StepContext, df: DataFrame) -> list[JsonDict]:
        fs, root, staging = self._prepare(ctx, df)
        files = [(f.path, f.rows) for f in write_parquet(df, fs, staging, self.partition_by)]
        adds = [a for a in self._adds(fs, root, staging, files) if a.num_records]
        ctx.add_metric("sink_rows", sum(a.num_records for a in adds))
        return self._committables(ctx, DeltaCommit(adds, [], []))

    def write_upsert(self, ctx: StepContext, rows: UpsertRows) -> list[JsonDict]:
        assert self.upsert is not None  # upsert mode
        fs, root, staging = self._prepare(ctx, rows.df)
        if live := self._upsert_files():
            staged = delta_upsert.stage(ctx, self.upsert, rows, fs, root, staging, live)
            commit = DeltaCommit(self._adds(fs, root, staging, staged.adds), staged.removes, staged.deletes)
            if commit.removes or commit.deletes:  # refused here, the checkpoint is aborted
                delta_commit.check_staged(fs, root, self.asset_uri(), ctx.checkpoint_id, commit)
            return self._committables(ctx, commit)
        files = []  # the first load: one file per bucket
        for b, full, count in self.upsert.write(ctx, rows, fs, staging, lambda _: {}):
            named = f"{staging}/{bucket_file(b)}"
            if full != named:
                fs.mv(full, named)
            files.append((named, count))
        return self._committables(ctx, DeltaCommit(self._adds(fs, root, staging, files), [], []))

    def _prepare(self, ctx: StepContext, df: DataFrame) -> tuple[fsspec.AbstractFileSystem, str, str]:
        """Create the table if it has none, refuse input not matching it, clear the attempt's staging
        directory: ``(filesystem, table root, staging directory)``."""
        from deltalake import DeltaTable
        from pyspark.sql.pandas.types import to_arrow_schema

        schema = to_arrow_schema(df.schema, timezone="UTC")
        table = self._delta()
        if table is None:
            table = DeltaTable.create(
                self.asset_uri(),
                schema,
                mode="ignore",
                partition_by=self.partition_by or None,
                storage_options=self.delta_options(),
                configuration={_DV_PROPERTY: "true"} if self.upsert else None,
            )
        self._check_input(table, schema)
        if self.upsert and table.metadata().configuration.get(_DV_PROPERTY) != "true":
            table.alter.set_table_properties({_DV_PROPERTY: "true"})  # a table of an earlier version of the sink
        fs, root = self._fs()
        staging = self.table().path(self.staging_name(ctx))
        if fs.exists(staging):
            fs.rm(staging, recursive=True)
        return fs, root, staging

    def _adds(
        self, fs: fsspec.AbstractFileSystem, root: str, staging: str, files: list[tuple[str, int | None]]
    ) -> list[DeltaFile]:
        """The add actions of the staged Parquet ``files`` (path, rows if known)."""
        return [self._add(fs, root, full, staging, rows) for full, rows in files if full.endswith(".parquet")]

    @staticmethod
    def _committables(ctx: StepContext, commit: DeltaCommit) -> list[JsonDict]:
        ctx.add_metric("sink_files_staged", len(commit.adds))
        ctx.add_metric("sink_bytes_staged", sum(a.size for a in commit.adds))
        return [
            {
                "checkpoint_id": ctx.checkpoint_id,
                "adds": [a.to_json() for a in commit.adds],
                "removes": [r.remove_json() for r in commit.removes],
                "deletes": [d.to_json() for d in commit.deletes],
            }
        ]

    def _add(self, fs: fsspec.AbstractFileSystem, root: str, full: str, staging: str, rows: int | None) -> DeltaFile:
        """The add action of a staged file: size, records (from its footer unless known), partition values
        from its directories."""
        import pyarrow.parquet as pq

        if rows is None:
            with fs.open(full, "rb") as f:
                rows = pq.ParquetFile(f).metadata.num_rows
        dirs = posixpath.relpath(posixpath.dirname(full), staging).split("/")
        values = dict(d.split("=", 1) for d in dirs if "=" in d)
        partition = {k: None if v == _HIVE_NULL else unquote(v) for k, v in values.items()}
        return DeltaFile(full[len(root) + 1 :], fs.size(full), rows, partition)

    def _check_input(self, table: DeltaTable, schema: Any) -> None:
        """Refuse input not matching the table: columns (:func:`check_input_columns`) and partitioning."""
        from deltalake.schema import Schema

        url = self.asset_uri()
        check_input_columns(url, _columns(table.schema()), _columns(Schema.from_arrow(schema)))
        partitioned = list(table.metadata().partition_columns)
        if partitioned != self.partition_by:  # an upsert sink has none
            raise SinkSchemaError(f"Delta table {url} is partitioned by {partitioned}, the sink by {self.partition_by}")

    def _files(self, version: int | None = None) -> dict[str, DataFile]:
        """The live files of the table (at ``version``) with their deletion vectors, from its log."""
        fs, root = self._fs()
        live = delta_log.snapshot(fs, root, self.asset_uri(), version)
        delta_storage.check_table(fs, root, self.asset_uri(), live.values())
        return live

    def _upsert_files(self) -> dict[str, DataFile]:
        """The live files of an upsert table; :class:`SinkClaimedError` naming the way back if another
        writer added files (they may repeat keys: the sink keeps one row per key over its own files only)."""
        live = self._files()
        paths = {p for p in live if not is_upsert_file(p)}
        if paths:
            fs, root = self._fs()
            latest = max(f.commit_version or 0 for f in live.values())
            added = delta_log.added_in(fs, root, self.asset_uri(), paths, latest)
            foreign = sorted((added.get(p, live[p].commit_version or 0), p) for p in paths)
            raise SinkClaimedError(self._foreign_files_message(foreign))
        return live

    def _foreign_files_message(self, foreign: list[tuple[int, str]]) -> str:
        """What another writer's files in the upsert table are and how to go on (docs/delta-lake.md)."""
        url, first = self.asset_uri(), foreign[0][0]
        versions = sorted({v for v, _ in foreign})
        ours = self.committed_versions()
        before = [(v, c) for c, v in ours.items() if v < first]
        after = sorted(c for c, v in ours.items() if v > first)
        if not before:
            way = "write the upsert to a new table path, or remove those files from this table"
        elif not after:
            way = (
                f"undo the other writer's commit(s) with DeltaTable({url!r}).restore({first - 1}) (no commit of this "
                "job came after them), then retry; restore the job with checkpoint=latest if it is FAILED"
            )
        else:
            version, checkpoint = max(before)
            way = (
                f"restore the job to checkpoint {checkpoint} (restore_from_checkpoint DAG): it returns the table to "
                f"version {version}, undoing them and this job's checkpoints {after} after them, which it replays"
            )
        return (
            f"Delta table {url}: version(s) {versions[:5]} added {len(foreign)} file(s) this upsert sink did not "
            f"write (e.g. {foreign[0][1]}): another writer appended to a table only this job may write, and its "
            f"rows may repeat keys, so the sink will not upsert over them. To go on: {way} "
            "(docs/delta-lake.md, 'Another writer in an upsert table')"
        )

    # -- committer (finalize / recovery) -------------------------------------------------
    def read_committables(self, checkpoint_id: int, committables: Any, document: str) -> DeltaCommit:
        buckets = self.upsert.buckets if self.upsert else 0
        return read_delta_committables(
            checkpoint_id, committables, self.upsert is not None, self.partition_by, buckets, document
        )

    def is_committed(self, checkpoint_id: int) -> bool:
        app_id, table = self.app_id(), self._delta()
        version = table.transaction_version(app_id) if app_id and table else None
        return version is not None and version >= checkpoint_id

    def commit_checked(self, checkpoint_id: int, committables: Any) -> None:
        """One Delta commit: the adds, the removes, the new DVs and ``txn(app id, checkpoint id)``; retried
        on conflicts with other writers. Every added file must exist with the size its committable names,
        every DV file must exist, every removed file must be in the table."""
        commit: DeltaCommit = committables
        app_id, table = self.app_id(), self._delta()
        document = f"committables of sink {self.uid} for checkpoint {checkpoint_id}"
        if app_id is None or table is None:
            raise DocumentError(
                document, "committables", f"name files of {self.asset_uri()}, which nothing staged into"
            )
        location = self.table()
        for add in commit.adds:
            try:
                size = location.fs.size(location.path(add.path))
            except FileNotFoundError:
                size = None
            if size != add.size:
                raise DocumentError(document, "adds", f"name a file that is missing or not {add.size} bytes", add.path)
        missing = sorted(str(f) for f in dv_files(commit) if not location.exists(f))
        if missing:
            raise DocumentError(document, "deletes", "name deletion vector files that do not exist", missing[:5])
        started = time.monotonic()
        if self.upsert is None:
            version: int | None = delta_commit.commit_append(table, app_id, checkpoint_id, commit, self.partition_by)
        else:
            fs, root = self._fs()
            committed = lambda: self.is_committed(checkpoint_id)  # noqa: E731
            version = delta_commit.commit(
                fs, root, self.asset_uri(), app_id, checkpoint_id, commit, document, committed
            )
            if version is not None and version % delta_commit.CHECKPOINT_INTERVAL == 0:
                self._open().create_checkpoint()
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
        self._delete_all_but(checkpoint_id, {a.path for a in commit.adds} | dv_files(commit))

    def committed_versions(self) -> dict[int, int]:
        """Checkpoint id → the Delta version that committed it, from the table's history."""
        app_id, table = self.app_id(), self._delta()
        if app_id is None or table is None:
            return {}
        versions: dict[int, int] = {}
        for entry in table.history():
            if entry.get("checkpoint_app_id") == app_id and entry.get("operation") != "RESTORE":
                f = Fields(entry, f"{self.asset_uri()} commit info")
                versions.setdefault(f.integer("checkpoint_id", 1), f.integer("version"))
        return versions

    def describe_commit(self, checkpoint_id: int) -> JsonDict:
        version = self.commit_record(checkpoint_id).get(self.uid, {}).get("delta_version")
        return {} if version is None else {"delta_version": version}

    record_kind = "delta"

    def commit_record(self, checkpoint_id: int) -> dict[str, JsonDict]:
        """The Delta version that committed ``checkpoint_id`` and its commit time, from the table's history:
        its newest commits first (the record is written just after the commit), the whole log if need be."""
        app_id, table = self.app_id(), self._delta()
        if app_id is None or table is None:
            return {}
        for limit in (_RECENT_COMMITS, None):
            for entry in table.history(limit):
                if entry.get("checkpoint_app_id") != app_id or entry.get("operation") == "RESTORE":
                    continue
                if entry.get("checkpoint_id") == checkpoint_id and type(entry.get("version")) is int:
                    stamp = entry.get("timestamp")
                    when = stamp / 1000 if type(stamp) is int and stamp >= 0 else None
                    return {self.uid: {"delta_version": entry["version"], "commit_time": when}}
        return {}

    def rollback(self, checkpoint_id: int) -> None:
        """Return the table to the version checkpoint ``checkpoint_id`` committed, in one ``RESTORE`` commit.

        Undoes every later commit (of any writer); a no-op when the table already holds
        exactly that version's files. Refused if the version is not in the log any more.
        """
        from deltalake import CommitProperties
        from deltalake.exceptions import DeltaError

        table = self._delta()
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

    def _leftovers(self, checkpoint_id: int, kept: set[str] | None = None) -> list[str]:
        """Files under ``chk-<id>/`` but not in ``kept`` (default: what the commit of that checkpoint added)."""
        location = self.table()
        prefix = f"chk-{checkpoint_id}"
        if not location.exists(prefix):
            return []
        if kept is None:
            version = self.committed_versions().get(checkpoint_id)
            kept = kept_files(self._files(version)) if version is not None else set()
        return [p for p in (location.relative(f) for f in location.fs.find(location.path(prefix))) if p not in kept]

    def _delete_all_but(self, checkpoint_id: int, kept: set[str] | None = None) -> None:
        location = self.table()
        location.delete_paths(self._leftovers(checkpoint_id, kept))
        if location.exists(f"chk-{checkpoint_id}") and not location.fs.find(location.path(f"chk-{checkpoint_id}")):
            location.delete(f"chk-{checkpoint_id}")

    def abort(self, checkpoint_id: int) -> None:
        """Delete every file of ``checkpoint_id`` its commit (if any) did not add: other and aborted attempts."""
        self._delete_all_but(checkpoint_id)

    def audit(self) -> list[str]:
        """Files under ``chk-<id>/`` that checkpoint's commit did not add, files the log no longer
        references beyond the table's ``delta.deletedFileRetentionDuration`` (a ``VACUUM`` deletes them),
        and commits of an upsert table that removed and re-added a file with the same deletion vector."""
        fs, root = self._fs()
        table, location = self._delta(), self.table()
        if table is None:
            return []
        names = [posixpath.basename(p.rstrip("/")) for p in fs.ls(root, detail=False)]
        ids = sorted(int(n[4:]) for n in names if n.startswith("chk-") and n[4:].isdigit())
        leftovers = [location.url(p) for i in ids for p in self._leftovers(i)]
        expired = [location.url(p) for p in map(unquote, table.vacuum(dry_run=True)) if location.exists(p)]
        return (
            [f"unreferenced sink file left behind: {u}" for u in leftovers]
            + [
                f"file the Delta log no longer references beyond its retention (VACUUM deletes it): {u}"
                for u in expired
                if u not in leftovers
            ]
            + (self._same_dv_findings(fs, root) if self.upsert else [])
        )

    def _same_dv_findings(self, fs: fsspec.AbstractFileSystem, root: str) -> list[str]:
        """Files live in the order of the log's commit files that readers drop, as a commit removed and
        re-added them with the same deletion vector (issue #30), and the checkpoint to restore the job to."""
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


def _columns(schema: Any) -> dict[str, str]:
    """Column name → Delta type of a delta-rs schema."""
    return {f.name: f.type.to_json().strip('"') for f in schema.fields}
