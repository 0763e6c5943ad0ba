"""An exactly-once Delta Lake table written with delta-rs (``deltalake``; no JVM connector).

Writer (the step): Spark's executors write the checkpoint's Parquet files straight into the
table directory under ``chk-<id>/<job>/<step>/attempt-<n>/``, names no log entry has; the
committables are their file actions (path, size, records, partition values), validated on
read (:mod:`.delta_files`).

Upsert (:mod:`.upsert`) is merge-on-read: the changed rows go to new files and the
rows they replace are deleted with deletion vectors, so its cost grows with the changed
keys; its commit is written by :mod:`.commit` (delta-rs's API has no DVs).

Committer (finalize, recovery, restore, abort, audit): :mod:`.committer`, one Delta commit per
checkpoint. Each entry point opens the table once (:mod:`.opened`). The claim (job, sink,
layout) lives in ``_table.json`` beside ``_delta_log``.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from airflow_provider_checkpoint.connectors.base import missing_columns
from airflow_provider_checkpoint.connectors.base.bucketed import DRIVER_MERGE_ROWS, BucketedUpsert, bucket_file
from airflow_provider_checkpoint.connectors.base.missing_columns import NONE_MISSING, Missing
from airflow_provider_checkpoint.connectors.base.sink import check_input_columns, check_mode, check_schema_evolution
from airflow_provider_checkpoint.connectors.base.upsert_rule import (
    UpsertRows,
    check_delete_column,
    check_sequence_by,
)
from airflow_provider_checkpoint.connectors.delta import commit as delta_commit
from airflow_provider_checkpoint.connectors.delta import evolution
from airflow_provider_checkpoint.connectors.delta import log as delta_log
from airflow_provider_checkpoint.connectors.delta import prepared as delta_prepared
from airflow_provider_checkpoint.connectors.delta import storage as delta_storage
from airflow_provider_checkpoint.connectors.delta import upsert as delta_upsert
from airflow_provider_checkpoint.connectors.delta.columns import arrow_columns, delta_rs_columns
from airflow_provider_checkpoint.connectors.delta.committer import DeltaCommitter
from airflow_provider_checkpoint.connectors.delta.files import DeltaCommit, DeltaFile, is_upsert_file
from airflow_provider_checkpoint.connectors.delta.layout import TableLayout, logged_layout, table_layout
from airflow_provider_checkpoint.connectors.delta.log import DataFile
from airflow_provider_checkpoint.connectors.delta.opened import OpenedTable, Prepared
from airflow_provider_checkpoint.connectors.delta.table import in_call
from airflow_provider_checkpoint.core.model import JsonDict
from airflow_provider_checkpoint.dataflow.graph import Node
from airflow_provider_checkpoint.exceptions import (
    PipelineDefinitionError,
    SinkClaimedError,
    SinkSchemaError,
    how_to_restore,
)
from airflow_provider_checkpoint.fileio.writes import write_parquet

if TYPE_CHECKING:
    import fsspec
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from airflow_provider_checkpoint.dataflow.context import StepContext
    from airflow_provider_checkpoint.dataflow.driver_rows import LazyFrame

FORMAT = "delta_table"
_DV_PROPERTY = "delta.enableDeletionVectors"
_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


class DeltaTableSink(DeltaCommitter):
    """Exactly-once Delta table in ``append`` or ``upsert`` (by ``keys``) mode; one commit per checkpoint.

    ``upsert`` writes the first load into ``buckets`` files hashed by ``keys``; later
    checkpoints write their changed rows as new files and delete the replaced rows with
    deletion vectors (readers must apply them: delta-rs ``scan()``, DuckDB, Spark with
    Delta): cost grows with the changed keys, not the table. ``partition_by`` is for
    ``append`` tables. The input's columns must equal the table's, unless
    ``schema_evolution="additive"``: then an input column the table lacks is added, nullable, by the
    checkpoint's own commit (:mod:`.evolution`).

    :param uid: Unique id of the sink in the pipeline.
    :param input: The node whose records the table receives.
    :param path: The table directory (a local path or URL delta-rs and fsspec both read).
    :param mode: ``"append"`` or ``"upsert"``.
    :param keys: The key columns of an upsert table.
    :param partition_by: Partition columns of an append table (created with them).
    :param buckets: Number of bucket files of an upsert table's first load (1 to 4096; fixed once written).
    :param driver_merge_rows: An upsert of at most this many input rows is collected in one Spark job (none,
        and any number, when its source read them on the driver: a Parquet ``FileSource``, a CDC stream) and
        written by the driver (pyarrow): a first load bucketed, a later checkpoint's update file; ``0``: Spark.
    :param storage_options: Options of the table's storage: ``s3fs``'s, or an Airflow ``aws`` connection as
        ``conn_id``; delta-rs's are derived from them (:mod:`.storage`).
    :param step: Name of the step (Airflow task) the sink runs in.
    :param sequence_by: Upsert mode: the column(s) that order several rows of one key in a
        checkpoint, greatest wins; ``None``: the later row in source order (:mod:`.upsert_rule`).
    :param delete_when: Upsert mode: a boolean input column; a key whose winning row (the rule of
        :mod:`.upsert_rule`) has it true is deleted (its live row deleted by a deletion vector, as an
        update deletes the row it replaces), and the column is not written (e.g. ``"tombstone"`` of a
        ``KafkaSource(upsert=True)``).
    :param deletes: Upsert mode with ``delete_when``: ``"hard"`` (default) removes a deleted key; ``"soft"``
        keeps the delete's row with ``deleted_column`` true, every other row with it false, so a later
        insert of the key revives it (:mod:`~airflow_provider_checkpoint.connectors.base.soft_delete`).
    :param deleted_column: Soft deletes: the table's boolean column marking a deleted key (default
        ``__deleted``, Debezium's name; it may be the ``delete_when`` column itself).
    :param inline_deletion_vectors: Upsert mode: deletion vectors up to 2 KiB go inline into the log
        (one file read less per data file for every reader) instead of into one DV file per checkpoint;
        delta-spark 4.4's ``VACUUM`` fails on a table holding inline DVs (docs/delta-lake.md).
    :param schema_evolution: ``"none"`` (default): the input's columns must be the table's. ``"additive"``: an
        input column the table lacks is appended to the table's schema, nullable, in the ``metaData`` action of
        the checkpoint's commit (Delta's ``mergeSchema``); a dropped or retyped column (widening included:
        no ``typeWidening`` feature is written) is still refused.
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
        delete_when: str | None = None,
        inline_deletion_vectors: bool = False,
        deletes: str = "hard",
        deleted_column: str | None = None,
        schema_evolution: str = "none",
    ) -> None:
        fsspec_options, self.delta_only = delta_storage.split_options(storage_options)
        super().__init__(uid, input, path, fsspec_options, step)
        check_mode(uid, mode)
        if mode == "upsert" and partition_by:
            raise PipelineDefinitionError(f"{uid}: partition_by is for append mode; upsert buckets by keys")
        self.mode = mode
        self.keys = list(keys or [])
        self.sequence_by = check_sequence_by(uid, mode, self.keys, sequence_by)
        self.set_deletes(delete_when, deletes, deleted_column)
        self.partition_by = list(partition_by or [])
        self.upsert = (
            BucketedUpsert(uid, self.keys, buckets, driver_merge_rows, self.delete_when) if mode == "upsert" else None
        )
        self.inline_dv_bytes = delta_upsert.INLINE_DV_BYTES if inline_deletion_vectors else 0
        self.schema_evolution = check_schema_evolution(uid, schema_evolution)
        self._records = {}

    def describe(self) -> dict[str, Any]:
        described = {**super().describe(), "format": FORMAT, "path": self.path, "mode": self.mode, "keys": self.keys}
        evolution = {"schema_evolution": self.schema_evolution} if self.schema_evolution != "none" else {}
        return {**described, **evolution}

    def required_columns(self) -> dict[str, list[str]]:
        return {**super().required_columns(), "partition_by": self.partition_by}

    def claim_document(self, job_id: str) -> JsonDict:
        claim = {**super().claim_document(job_id), "format": FORMAT, "mode": self.mode, "keys": self.keys}
        return {**claim, "buckets": self.upsert.buckets} if self.upsert else claim

    # -- writer (in the step) ------------------------------------------------------------
    def prepare(self, ctx: StepContext) -> None:
        """An upsert's stage prepared on a thread while the step reads its input (:mod:`.prepared`): the log
        and the live files; the key columns too for a table on local storage (on an object store the stage
        reads only those of the files its changed keys can be in)."""
        if self.upsert is not None:
            fs, root = self._fs()
            table = OpenedTable(fs, root, self.asset_uri(), self.delta_options())
            delta_prepared.start(self, ctx, table, self._snapshot, self.keys)

    @contextmanager
    def _staging(self, ctx: StepContext) -> Iterator[None]:
        """The stage's call: in the table :meth:`prepare` opened for it, if it did (:mod:`.opened`)."""
        with self.opened(delta_prepared.take(self, ctx)):
            yield

    def stage(self, ctx: StepContext, data: DataFrame | LazyFrame) -> list[JsonDict]:
        """Check the target, claim it, stage the checkpoint's files: the table opened once (:mod:`.opened`)."""
        with self._staging(ctx):
            return super().stage(ctx, data)

    @in_call
    def check_input(self, df: DataFrame) -> None:
        """:meth:`stage`'s checks without writing: the table opened once (:mod:`.opened`), only its log read."""
        super().check_input(df)

    def check_columns(self, schema: StructType) -> None:
        """The input's columns (but ``delete_when``) and the sink's partitioning against the table's, when it
        has one."""
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import StructType

        layout = self._existing_layout()
        if layout is not None:
            written = StructType([f for f in schema.fields if f.name != self.delete_when])
            self._check_input(layout, to_arrow_schema(written, timezone="UTC"))

    def _existing_layout(self) -> TableLayout | None:
        """The table's layout from the log the log check replayed, else from delta-rs; ``None``: no table yet."""
        layout = logged_layout(self._table().state())
        table = self._delta() if layout is None else None
        return layout if table is None else table_layout(table)

    def write(self, ctx: StepContext, df: DataFrame) -> list[JsonDict]:
        fs, root, staging, added, missing = self._prepare(ctx, df.schema)
        df = missing.frame(df)
        written = write_parquet(df, fs, staging, self.partition_by, held=self.held_input(ctx))
        files = [(f.path, f.rows) for f in written]
        adds = [a for a in self._adds(fs, root, staging, files, {f.path: f.size for f in written}) if a.num_records]
        ctx.add_metric("sink_rows", sum(a.num_records for a in adds))
        return self._committables(ctx, DeltaCommit(adds, [], [], added))

    def write_upsert(self, ctx: StepContext, rows: UpsertRows) -> list[JsonDict]:
        from pyspark.sql.types import StructType

        assert self.upsert is not None  # upsert mode
        check_delete_column(self.uid, self.delete_when, rows.schema)
        written = StructType([f for f in rows.schema.fields if f.name != self.delete_when])
        fs, root, staging, added, missing = self._prepare(ctx, written)
        ahead = self._table().prepared
        seen = self._upsert_snapshot(ahead)
        live = seen.files
        if missing.fields:  # a key keeps its values in them, as Delta's MERGE keeps them
            held = [evolution.table_file(fs, root, f) for f in live.values()]
            rows = missing_columns.upsert_rows(f"Delta table {self.asset_uri()}", fs, held, rows, missing)
        if live:
            read = ahead.read if ahead else None
            staged = delta_upsert.stage(ctx, self.upsert, rows, fs, root, staging, live, self.inline_dv_bytes, read)
            commit = DeltaCommit(self._adds(fs, root, staging, staged.adds), staged.removes, staged.deletes, added)
            if commit.removes or commit.deletes:  # refused here, the checkpoint is aborted
                delta_commit.check_staged(fs, root, self.asset_uri(), ctx.checkpoint_id, commit, seen, staged.known)
            return self._committables(ctx, commit)
        files = []  # the first load: one file per bucket
        for staged_bucket in self.upsert.stage(ctx, rows, fs, staging, lambda _: {}):
            if staged_bucket.rows == 0:  # every row of the bucket deleted its key
                fs.rm(staged_bucket.path)
                continue
            named = f"{staging}/{bucket_file(staged_bucket.bucket)}"
            if staged_bucket.path != named:
                fs.mv(staged_bucket.path, named)
            files.append((named, staged_bucket.rows))
        return self._committables(ctx, DeltaCommit(self._adds(fs, root, staging, files), [], [], added))

    def _prepare(
        self, ctx: StepContext, columns: StructType
    ) -> tuple[fsspec.AbstractFileSystem, str, str, list[dict[str, Any]], Missing]:
        """Create the table if it has none, refuse input of ``columns`` not matching it, clear the attempt's
        staging directory: ``(filesystem, table root, staging directory, columns the commit adds, the table's
        columns the input lacks)``."""
        from pyspark.sql.pandas.types import to_arrow_schema

        schema = to_arrow_schema(columns, timezone="UTC")
        layout = self._existing_layout()
        if layout is None:
            from deltalake import DeltaTable

            table = self._table().created(
                DeltaTable.create(
                    self.asset_uri(),
                    schema,
                    mode="ignore",
                    partition_by=self.partition_by or None,
                    storage_options=self.delta_options(),
                    configuration={_DV_PROPERTY: "true"} if self.upsert else None,
                )
            )
            layout = table_layout(table)
        added, missing = self._check_input(layout, schema)
        if self.upsert and layout.configuration.get(_DV_PROPERTY) != "true":
            existing = self._delta()
            assert existing is not None  # the layout came from a table
            existing.alter.set_table_properties({_DV_PROPERTY: "true"})  # a table of an earlier version of the sink
        fs, root = self._fs()
        directory = self.table()
        directory.delete(self.staging_name(ctx))  # an earlier try's files; on S3 one listing when there are none
        return fs, root, directory.path(self.staging_name(ctx)), added, missing

    def _adds(
        self,
        fs: fsspec.AbstractFileSystem,
        root: str,
        staging: str,
        files: list[tuple[str, int | None]],
        sizes: dict[str, int] | None = None,
    ) -> list[DeltaFile]:
        """The add actions of the staged Parquet ``files`` (path, rows if known); their ``sizes`` as the writer
        knows them, else from one listing of ``staging``."""
        if sizes is None:
            sizes = {path: int(info["size"]) for path, info in fs.find(staging, detail=True).items()}
        return [self._add(root, full, staging, rows, sizes[full]) for full, rows in files if full.endswith(".parquet")]

    @staticmethod
    def _committables(ctx: StepContext, commit: DeltaCommit) -> list[JsonDict]:
        ctx.add_metric("sink_files_staged", len(commit.adds))
        ctx.add_metric("sink_bytes_staged", sum(a.size for a in commit.adds))
        committable: JsonDict = {
            "checkpoint_id": ctx.checkpoint_id,
            "adds": [a.to_json() for a in commit.adds],
            "removes": [r.remove_json() for r in commit.removes],
            "deletes": [d.to_json() for d in commit.deletes],
        }
        return [{**committable, "add_columns": commit.columns} if commit.columns else committable]

    def _add(self, root: str, full: str, staging: str, rows: int | None, size: int) -> DeltaFile:
        """The add action of a staged file: ``size``, records (from its footer unless known), partition values
        from its directories."""
        import pyarrow.parquet as pq

        if rows is None:
            fs = self._fs()[0]
            with fs.open(full, "rb", size=size) as f:
                rows = pq.ParquetFile(f).metadata.num_rows
        dirs = posixpath.relpath(posixpath.dirname(full), staging).split("/")
        values = dict(d.split("=", 1) for d in dirs if "=" in d)
        partition = {k: None if v == _HIVE_NULL else unquote(v) for k, v in values.items()}
        return DeltaFile(full[len(root) + 1 :], size, rows, partition)

    def _check_input(self, layout: TableLayout, schema: Any) -> tuple[list[dict[str, Any]], Missing]:
        """Refuse input not matching the table: columns (:func:`check_input_columns`) and partitioning; the
        input columns the commit adds and the table's (nullable) ones it lacks, written null
        (``schema_evolution="additive"``, :mod:`~.base.missing_columns`)."""
        url = self.asset_uri()
        evolve = (
            "schema_evolution='additive' adds them in the checkpoint's commit; else add them to the table "
            "first, e.g. DeltaTable.alter.add_columns, then restart the job"
        )
        flat = arrow_columns(schema) if self.schema_evolution == "none" else None  # no delta-rs for flat columns
        added: list[dict[str, Any]] = []
        if flat is None:
            from deltalake.schema import Schema

            delta_schema = Schema.from_arrow(schema)
            added = evolution.added_columns(layout.columns, delta_schema)
            flat = delta_rs_columns(delta_schema)
        given = {c: t for c, t in flat.items() if c not in {f["name"] for f in added}}
        missing = NONE_MISSING
        if self.schema_evolution != "none" and set(layout.columns) - set(given):
            missing = evolution.missing(f"Delta table {url}", layout.schema, layout.configuration, given)
            given.update({f.name: layout.columns[f.name] for f in missing.fields})
        check_input_columns(f"Delta table {url}", layout.columns, given, evolve)
        if layout.partition_by != self.partition_by:  # an upsert sink has none
            raise SinkSchemaError(
                f"Delta table {url} is partitioned by {layout.partition_by}, the sink by {self.partition_by}"
            )
        return added, missing

    def _upsert_files(self) -> dict[str, DataFile]:
        """The live files of an upsert table (:meth:`_upsert_snapshot`)."""
        return self._upsert_snapshot().files

    def _upsert_snapshot(self, ahead: Prepared | None = None) -> delta_log.Snapshot:
        """The latest snapshot of an upsert table (``ahead``'s, as a preparation read it); :class:`SinkClaimedError`
        naming the way back if another writer added files (they may repeat keys: the sink keeps one row per key
        over its own files only)."""
        snapshot = ahead.snapshot if ahead else self._snapshot()
        live = snapshot.files
        paths = {p for p in live if not is_upsert_file(p)}
        if paths:
            fs, root = self._fs()
            latest = max(f.commit_version or 0 for f in live.values())
            added = delta_log.added_in(fs, root, self.asset_uri(), paths, latest)
            foreign = sorted((added.get(p, live[p].commit_version or 0), p) for p in paths)
            raise SinkClaimedError(self._foreign_files_message(foreign))
        return snapshot

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
                f"restore the job to checkpoint {checkpoint} ({how_to_restore(str(checkpoint))}): it returns the "
                f"table to version {version}, undoing them and this job's checkpoints {after} after them, which it "
                "replays"
            )
        return (
            f"Delta table {url}: version(s) {versions[:5]} added {len(foreign)} file(s) this upsert sink did not "
            f"write (e.g. {foreign[0][1]}): another writer appended to a table only this job may write, and its "
            f"rows may repeat keys, so the sink will not upsert over them. To go on: {way} "
            "(docs/delta-lake.md, 'Another writer in an upsert table')"
        )
