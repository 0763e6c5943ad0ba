"""A Delta Lake table as a replayable source: the barrier records the table version."""

from __future__ import annotations

import logging
import posixpath
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import fsspec

from airflow_provider_checkpoint.connectors.base.table_urls import known_table_url
from airflow_provider_checkpoint.connectors.delta import log as delta_log
from airflow_provider_checkpoint.connectors.delta import storage as delta_storage
from airflow_provider_checkpoint.connectors.delta.log import DataFile, Position
from airflow_provider_checkpoint.connectors.delta.scan import TableScan, output_schema
from airflow_provider_checkpoint.core.documents import JsonDict
from airflow_provider_checkpoint.dataflow.graph import Source
from airflow_provider_checkpoint.exceptions import DeltaSourceError, InvalidPositionError, PipelineDefinitionError
from airflow_provider_checkpoint.storage.job_storage import Location

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from airflow_provider_checkpoint.dataflow.context import StepContext

log = logging.getLogger(__name__)


class DeltaSource(Source):
    """The changes of a Delta table (written by anyone: Spark, delta-rs, our ``DeltaTableSink``).

    The barrier position is ``{"version": v, "table_id": id}``: the table version current
    at trigger time. A checkpoint reads exactly the changes of the commits after the
    restore point's version up to the barrier's, so every commit is read by one completed
    checkpoint, and a retry reads the same rows (commits are immutable). Only the list of
    files passes through the driver; Spark reads the Parquet files, with the partition
    columns taken from the log's partition values and the columns of the table's schema
    at the barrier version (a column added later reads as null in older files).

    - ``change_data_feed=False``: the rows of the files the commits add (``dataChange``
      ones: a compaction is not read again). A commit that removes data (update, delete,
      merge, overwrite) is refused with :class:`DeltaSourceError`: read such tables with
      the change data feed.
    - ``change_data_feed=True``: every change as a row with ``_change_type`` and
      ``_commit_version``. Where the writer recorded Delta's change data (table property
      ``delta.enableChangeDataFeed=true``): its rows (``insert``, ``delete``,
      ``update_preimage``, ``update_postimage``). Elsewhere (any writer, e.g. our
      ``DeltaTableSink``'s upserts): the rows of the files a commit removes as ``delete`` and
      of those it adds as ``insert`` — exact as a net change, the unchanged rows of a
      rewritten file coming out once deleted and once inserted. A file's rows are those its
      action's deletion vector leaves (Spark's ``_metadata.row_index``), so a commit giving
      a file a new DV (our upserts, Spark's DELETE/MERGE) reads as the newly deleted rows.

    **First checkpoint.** ``starting_version=None`` (default) reads the table as of the
    first barrier's version — its current rows, as inserts of that version with the change
    data feed — and the commits after it from then on (Delta's streaming source does the
    same); the history before it need not be retained. ``starting_version=n`` reads the
    changes of commits ``n`` onwards instead (``0``: the whole history, which must still be
    in the log and not vacuumed).

    **Refusals** (:class:`DeltaSourceError`, no retry, nothing committed): the log no
    longer holds a commit of the range, or a file of it was vacuumed (the message names the
    versions: restore from a newer checkpoint, or start the job afresh); the table was
    replaced (another ``metaData.id``); column mapping; without the change data feed, a
    ``RESTORE`` commit (e.g. the upstream job was restored) unless ``on_restore="skip"``.

    :param uid: Stable id of the source (keys its position in checkpoints).
    :param path: URL of the table root (a local path, ``s3://...``).
    :param storage_options: Options of the table's storage, as ``DeltaTableSink`` takes them:
        ``s3fs``'s or an Airflow ``aws`` connection as ``conn_id`` (:mod:`.storage`).
    :param change_data_feed: Read inserts, updates and deletes as change rows (see above).
    :param starting_version: The first commit the job reads; ``None``: the table's rows at the
        first barrier, then its commits.
    :param max_commits_per_checkpoint: Split a backlog of commits over several checkpoints.
    :param on_restore: Without the change data feed, what a ``RESTORE`` commit of the table does:
        ``"fail"`` (default) refuses it naming the ways back; ``"skip"`` reads it as no change and goes
        on: the rows it undid stay in this job's output (read once, never retracted) and rows the
        writer appends again after it are read again (at least once across an upstream restore).
    """

    def __init__(
        self,
        uid: str,
        path: str,
        storage_options: dict[str, Any] | None = None,
        change_data_feed: bool = False,
        starting_version: int | None = None,
        max_commits_per_checkpoint: int | None = None,
        on_restore: str = "fail",
        watermark: tuple[str, str] | None = None,
    ) -> None:
        super().__init__(uid, watermark)
        if on_restore not in delta_log.ON_RESTORE:
            raise PipelineDefinitionError(f"{uid}: on_restore must be one of {list(delta_log.ON_RESTORE)}")
        if starting_version is not None and (isinstance(starting_version, bool) or starting_version < 0):
            raise PipelineDefinitionError(f"{uid}: starting_version must be a table version (>= 0) or None")
        if max_commits_per_checkpoint is not None and max_commits_per_checkpoint < 1:
            raise PipelineDefinitionError(f"{uid}: max_commits_per_checkpoint must be at least 1")
        self.path = path
        self.storage_options, self.delta_only = delta_storage.split_options(storage_options)
        self.change_data_feed = change_data_feed
        self.starting_version = starting_version
        self.max_commits_per_checkpoint = max_commits_per_checkpoint
        self.on_restore = on_restore

    def to_spec(self) -> JsonDict:
        return {
            "uid": self.uid,
            "path": self.path,
            "storage_options": {**self.storage_options, **self.delta_only},
            "change_data_feed": self.change_data_feed,
            "starting_version": self.starting_version,
            "max_commits_per_checkpoint": self.max_commits_per_checkpoint,
            "on_restore": self.on_restore,
        }

    def reads_target(self, target: str) -> bool:
        """Whether ``target`` is this table."""
        return target == known_table_url(self.uid, self.path)

    def describe(self) -> JsonDict:
        skip = {"on_restore": self.on_restore} if self.on_restore != "fail" else {}
        return {**super().describe(), "path": self.path, "change_data_feed": self.change_data_feed, **skip}

    # -- positions and the log (no Spark) ------------------------------------------------
    def _fs(self) -> tuple[fsspec.AbstractFileSystem, str]:
        location = Location.from_url(self.path, **self.storage_options)
        return location.fs, location.base

    def _delta_options(self) -> dict[str, str]:
        return delta_storage.delta_rs_options(self._fs()[0], self.storage_options, self.delta_only)

    def _table(self, version: int | None = None, table_id: str | None = None) -> DeltaTable:
        """The table (at ``version``), checked readable and, given ``table_id``, the same table."""
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError, TableNotFoundError

        at = "" if version is None else f" at version {version}"
        fs, root = self._fs()
        delta_storage.check_table(fs, root, self.path)
        try:
            table = DeltaTable(self.path, version, self._delta_options(), without_files=True)
        except TableNotFoundError:
            raise DeltaSourceError(f"source {self.uid}: {self.path} is not a Delta table") from None
        except DeltaError as e:
            raise DeltaSourceError(
                f"source {self.uid}: Delta table {self.path} cannot be loaded{at} ({str(e)[:300]}): "
                "its log may have been cleaned up past this version"
            ) from None
        metadata = table.metadata()
        if table_id is not None and metadata.id != table_id:
            raise DeltaSourceError(
                f"source {self.uid}: Delta table {self.path} was replaced (table id {metadata.id}, "
                f"the job read {table_id}); start the job afresh to read the new table"
            )
        delta_log.check_metadata({"configuration": metadata.configuration}, self.path, table.version())
        return table

    def _start(self, previous: Any) -> Position | None:
        """The position a checkpoint reads from; ``None``: the table's rows at the barrier."""
        start = delta_log.validate_position(self.uid, previous)
        if start is None and self.starting_version is not None:
            return Position(self.starting_version - 1)
        return start

    def initial_position(self) -> JsonDict | None:
        return None if self.starting_version is None else {"version": self.starting_version - 1}

    def barrier_position(self, previous: Any) -> JsonDict:
        """The table version now (at most ``max_commits_per_checkpoint`` commits ahead); the
        commits of the range are checked readable here, before the checkpoint starts."""
        start = self._start(previous)
        table = self._table(table_id=start.table_id if start else None)
        current, table_id = table.version(), table.metadata().id
        end = current
        if start is not None:
            if start.version > current:
                raise InvalidPositionError(
                    f"source {self.uid}: the stored position (version {start.version}) is ahead of Delta table "
                    f"{self.path}, whose latest version is {current}: the position is not one this job read "
                    "(its commits up to it would be skipped); restore the job to an earlier checkpoint"
                )
            if self.max_commits_per_checkpoint is not None:
                end = min(end, start.version + self.max_commits_per_checkpoint)
            self._changes(start.version, end)
        return {"version": end, "table_id": table_id}

    def split(self, previous: Any, barrier: Any) -> list[DataFile]:
        """The files holding the changes in ``(previous, barrier]`` (positions validated)."""
        start, end = self._start(previous), delta_log.validate_position(self.uid, barrier)
        if end is None:
            raise InvalidPositionError(f"source {self.uid}: a barrier position is missing")
        if start is None:
            return self._snapshot(end)
        return self._changes(start.version, end.version)

    def _changes(self, start: int, end: int) -> list[DataFile]:
        if end <= start:
            return []
        fs, root = self._fs()
        delta_storage.check_table(fs, root, self.path)
        commits = [delta_log.read_commit(fs, root, v, self.path) for v in range(start + 1, end + 1)]
        for commit in commits:
            if commit.metadata is not None:
                delta_log.check_metadata(commit.metadata, self.path, commit.version)
        files = []
        for c in commits:
            changed = delta_log.changed_files(c, self.path, self.change_data_feed, self.on_restore)
            if c.operation == delta_log.RESTORE and not self.change_data_feed and not changed:
                log.warning(
                    "source %s: commit %d of %s is a RESTORE, read as no change", self.uid, c.version, self.path
                )
            files += changed
        return files

    def _snapshot(self, end: Position) -> list[DataFile]:
        """The files of the table at ``end`` with their deletion vectors: its rows (inserts of that version
        with the feed)."""
        self._table(end.version, end.table_id)  # the table is still the one read so far
        fs, root = self._fs()
        change, version = ("insert", end.version) if self.change_data_feed else (None, None)
        files = delta_log.snapshot(fs, root, self.path, end.version).values()
        return [f._replace(change_type=change, commit_version=version) for f in files]

    def _check_present(self, files: Sequence[DataFile], start: Position | None, end: Position) -> None:
        """Every file is still there: a vacuumed one is a :class:`DeltaSourceError` naming the versions."""
        fs, root = self._fs()
        by_dir: dict[str, set[str]] = defaultdict(set)
        for f in files:
            by_dir[posixpath.dirname(f"{root}/{f.path}")].add(posixpath.basename(f.path))
        for directory, names in by_dir.items():
            present = {posixpath.basename(p) for p in fs.ls(directory, detail=False)} if fs.isdir(directory) else set()
            missing = sorted(names - present)
            if missing:
                read = f"versions {start.version + 1}..{end.version}" if start else f"version {end.version}"
                raise DeltaSourceError(
                    f"source {self.uid}: Delta table {self.path} was vacuumed past this job's position: "
                    f"{len(missing)} file(s) of {read} are gone (e.g. {posixpath.relpath(directory, root)}/"
                    f"{missing[0]}); restore from a newer checkpoint or start the job afresh"
                )

    # -- reading (Spark) -------------------------------------------------------------------
    def read(self, ctx: StepContext, previous: Any, barrier: Any) -> DataFrame:
        from pyspark.sql.types import StructType

        start, end = self._start(previous), delta_log.validate_position(self.uid, barrier)
        files = self.split(previous, barrier)
        assert end is not None  # split refused a missing barrier
        self._check_present(files, start, end)
        table = self._table(end.version, end.table_id)
        schema = StructType.fromJson(delta_log.load_schema(table.schema().to_json(), self.path))
        ctx.add_metric("files_in", len(files))
        read = (
            f"the snapshot at version {end.version}"
            if start is None
            else f"versions {start.version + 1}..{end.version}"
        )
        log.info("source %s: %d file(s) of %s, %s", self.uid, len(files), self.path, read)
        return self._scan().load(ctx.spark, schema, table.metadata().partition_columns, files).cache()

    def empty(self, spark: SparkSession) -> DataFrame:
        """The columns of the table's latest version (with the change columns with the feed), no rows; its log's
        metadata is read, no data file."""
        from pyspark.sql.types import StructType

        schema = StructType.fromJson(delta_log.load_schema(self._table().schema().to_json(), self.path))
        return spark.createDataFrame([], self.output_schema(schema))

    def read_version(self, spark: SparkSession, version: int | None = None) -> DataFrame:
        """The table's rows at ``version`` (default: the latest) as Spark reads them from the version's
        files: partition columns from the log, rows deleted by deletion vectors left out. For readers
        without Delta's JVM connector; the change columns are not added."""
        from pyspark.sql.types import StructType

        plain = DeltaSource(self.uid, self.path, {**self.storage_options, **self.delta_only})  # no change columns
        table = plain._table(version)
        files = plain._snapshot(Position(table.version()))
        schema = StructType.fromJson(delta_log.load_schema(table.schema().to_json(), self.path))
        return plain._scan().load(spark, schema, table.metadata().partition_columns, files)

    def output_schema(self, schema: StructType) -> StructType:
        """The columns this source gives: the table's, plus the change columns with the feed."""
        return output_schema(schema, self.change_data_feed)

    def _scan(self) -> TableScan:
        """How this source reads data files (:class:`.scan.TableScan`), in source order if the step needs it."""
        fs, root = self._fs()
        return TableScan(fs, root, self.path, self.change_data_feed, self.in_source_order)
