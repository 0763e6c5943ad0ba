"""A Parquet table with two-phase commit, readable by plain ``spark.read.parquet`` and pyarrow.

Table layout::

    <table>/part-*.parquet          committed data: all a reader sees
    <table>/_staging/chk-<id>/…     staged by steps; hidden from readers (leading ``_``)
    <table>/_commits/<id>.json      commit log: checkpoint <id> is committed

Staged files become visible by publishing each into place (:func:`~.base.table_files.publish`):
a rename locally, one server-side copy on an object store; either replaces a file
atomically, so a reader (pyarrow, DuckDB, Spark) sees each file either whole or not at all,
and never staged data. Commit is idempotent: a logged checkpoint is skipped, and a commit
that stopped half-way publishes again what is still staged (a file already renamed is not
moved again). Every path the sink reads, moves, creates or deletes goes through the
table's :class:`~airflow_provider_checkpoint.storage.Location`: a symlink in the table
(``_staging``, ``_commits``, ``_rolled_back``, a part file) that leads out of it is refused.

Requests on S3 per checkpoint (a commit of ``n`` files, an upsert touching ``b`` buckets):
the step reads the claim (one GET), lists its staging directory and the bucket files (a
LIST each), reads one bucket file's footer (one ranged GET: the input's columns checked against
the table's), reads each affected bucket once (one GET up to 32 MiB) and writes it (one PUT);
an append step lists the files of the last ten checkpoints (one LIST, wider only after checkpoints
that wrote nothing: :func:`~.parquet_files.newest_appended`) and reads the newest one's footer (one
ranged GET) instead of the bucket files;
the commit checks the log (one HEAD), lists the staging directory (one LIST), copies each
file (``n`` copies), writes the log (one PUT) and deletes the staging directory (one bulk
DELETE). No HEAD of a file whose size a listing or the writer already gave.
"""

from __future__ import annotations

import json
import posixpath
import time
from typing import TYPE_CHECKING, Any

import fsspec

from airflow_provider_checkpoint.connectors.base import missing_columns
from airflow_provider_checkpoint.connectors.base.bucketed import (
    DRIVER_MERGE_ROWS,
    BucketedUpsert,
    StagedBucket,
    bucket_file,
    check_buckets,
)
from airflow_provider_checkpoint.connectors.base.sink import (
    TableDirectorySink,
    check_mode,
    check_schema_evolution,
)
from airflow_provider_checkpoint.connectors.base.table_files import (
    Listing,
    list_names,
    list_tree,
    publish_all,
    read_document,
)
from airflow_provider_checkpoint.connectors.base.upsert_rule import (
    UpsertRows,
    check_delete_column,
    check_sequence_by,
)
from airflow_provider_checkpoint.connectors.files import parquet_schema
from airflow_provider_checkpoint.connectors.files.parquet_files import (
    APPEND_FILE,
    check_table_committables,
    newest_appended,
    table_file_pattern,
)
from airflow_provider_checkpoint.core.documents import Fields, load_json, relative_path
from airflow_provider_checkpoint.core.model import JsonDict
from airflow_provider_checkpoint.dataflow.graph import Node
from airflow_provider_checkpoint.exceptions import (
    CheckpointStorageError,
    DocumentError,
    UnsafePathError,
)
from airflow_provider_checkpoint.fileio.writes import write_parquet
from airflow_provider_checkpoint.storage.job_storage import Location
from airflow_provider_checkpoint.storage.paths import refuse_links

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from airflow_provider_checkpoint.dataflow.context import StepContext

FORMAT = "parquet_table"


class ParquetTableSink(TableDirectorySink):
    """Exactly-once Parquet table in ``append`` or ``upsert`` (by ``keys``) mode.

    ``append`` adds the checkpoint's rows as new files ``part-c<checkpoint>-<n>.parquet``.
    ``upsert`` hashes ``keys`` into ``buckets`` files ``part-b<bucket>.parquet`` and
    rewrites only the buckets whose keys changed, replacing each atomically
    (:class:`~.bucketed.BucketedUpsert`): a key is in the table exactly once (a null key
    too). One job writes a table.

    :param uid: Unique id of the sink in the pipeline.
    :param input: The node whose records the table receives.
    :param path: The table directory (a local path or fsspec URL).
    :param mode: ``"append"`` or ``"upsert"``.
    :param keys: The key columns of an upsert table.
    :param buckets: Number of bucket files of an upsert table (1 to 4096; fixed once written).
    :param sequence_by: Upsert mode: the column(s) that order several rows of one key in a
        checkpoint, greatest wins; ``None``: the later row in source order (:mod:`.upsert_rule`).
    :param driver_merge_rows: Upserts of at most this many changed rows merge in the driver
        with pyarrow (no shuffle), and of any number that its source read on the driver; ``0`` always
        merges with Spark.
    :param delete_when: Upsert mode: a boolean input column; a key whose winning row (the rule of
        :mod:`.upsert_rule`) has it true is deleted from the table, and the column is not written
        (e.g. ``"tombstone"`` of a ``KafkaSource(upsert=True)``: Flink's upsert-kafka deletes).
    :param deletes: Upsert mode with ``delete_when``: ``"hard"`` (default) removes a deleted key; ``"soft"``
        keeps the delete's row with ``deleted_column`` true, every other row with it false, so a later
        insert of the key revives it (:mod:`~airflow_provider_checkpoint.connectors.base.soft_delete`).
    :param deleted_column: Soft deletes: the table's boolean column marking a deleted key (default
        ``__deleted``, Debezium's name; it may be the ``delete_when`` column itself).
    :param schema_evolution: ``"none"`` (default): the input's columns must be the table's (checked by every
        step against its newest file's footer, before anything is staged). ``"additive"``: an input column the
        table lacks is written, nullable, from the checkpoint that brings it on, and that checkpoint rewrites
        every other file of the table (the bucket files it does not touch; in append mode every earlier file)
        with the column null (:mod:`.parquet_schema`), so every file has the table's whole schema; an input
        lacking a nullable column is written with it null (upsert: only while every bucket file's footer counts
        it all null, :mod:`~.base.missing_columns`). A retyped column (widening included) is refused either way.
    :param storage_options: fsspec options of the table's filesystem.
    :param step: Name of the step (Airflow task) the sink runs in.
    """

    def __init__(
        self,
        uid: str,
        input: Node,
        path: str,
        mode: str = "append",
        keys: list[str] | None = None,
        buckets: int = 8,
        driver_merge_rows: int = DRIVER_MERGE_ROWS,
        storage_options: dict[str, Any] | None = None,
        step: str | None = None,
        sequence_by: list[str] | None = None,
        delete_when: str | None = None,
        deletes: str = "hard",
        deleted_column: str | None = None,
        schema_evolution: str = "none",
    ) -> None:
        super().__init__(uid, input, path, storage_options, step)
        check_mode(uid, mode)
        self.mode = mode
        self.keys = list(keys or [])
        self.sequence_by = check_sequence_by(uid, mode, self.keys, sequence_by)
        self.set_deletes(delete_when, deletes, deleted_column)
        self.buckets = buckets
        self.schema_evolution = check_schema_evolution(uid, schema_evolution)
        self.upsert = (
            BucketedUpsert(uid, self.keys, buckets, driver_merge_rows, self.delete_when) if mode == "upsert" else None
        )
        check_buckets(uid, buckets, driver_merge_rows)
        self._logged: dict[int, JsonDict] = {}
        """The commit logs this process wrote, by checkpoint id (a commit's record needs no read back)."""

    def describe(self) -> dict[str, Any]:
        evolution = {"schema_evolution": self.schema_evolution} if self.schema_evolution != "none" else {}
        described = {"format": FORMAT, "path": self.path, "mode": self.mode, "keys": self.keys, **evolution}
        return {**super().describe(), **described}

    def claim_document(self, job_id: str) -> JsonDict:
        claim = {**super().claim_document(job_id), "mode": self.mode, "keys": self.keys}
        return {**claim, "buckets": self.buckets} if self.keys else claim

    @staticmethod
    def _rolled_back(checkpoint_id: int) -> str:
        return f"_rolled_back/chk-{checkpoint_id}"

    @staticmethod
    def _commit_log(checkpoint_id: int) -> str:
        return f"_commits/{checkpoint_id:010d}.json"

    # -- writer (in the step) ----------------------------------------------------------
    record_kind = "parquet"

    def check_columns(self, schema: StructType) -> None:
        """The input's columns against those of the table's newest committed file (:meth:`_checked_table`)."""
        self._checked_table(schema)

    def _checked_table(
        self, schema: StructType, listed: Listing | None = None
    ) -> tuple[pa.Schema | None, missing_columns.Missing]:
        """The schema of the table's newest committed file (its footer: one LIST, unless ``listed`` has the
        table's files, and one ranged read), ``None`` for a table without files, once the input's columns
        ``schema`` are checked against it (:func:`.parquet_schema.check_columns`); the table's columns the
        input lacks, written null (``"additive"``)."""
        footer = parquet_schema.table_schema(self.table(), listed)
        if footer is None:
            return None, missing_columns.NONE_MISSING
        additive = self.schema_evolution == "additive"
        name = f"Parquet table {self.asset_uri()}"
        return footer, parquet_schema.check_columns(name, footer, schema, self.delete_when, additive)

    def write(self, ctx: StepContext, df: DataFrame) -> list[JsonDict]:
        # always: files of two schemas would be read with one file's columns (pyarrow, Spark) or not at all (DuckDB)
        table, missing = self._checked_table(df.schema, newest_appended(self.table(), ctx.checkpoint_id))
        df = missing.frame(df)
        fs, root = self._fs()
        moves = self._stage_append(ctx, df, fs, root, self.attempt_staging(ctx))
        if table is not None and moves and self.schema_evolution == "additive":
            moves += self._filled_appends(ctx, table, df.schema, fs, root)
        return self._committables(ctx, moves)

    def _filled_appends(
        self, ctx: StepContext, table: pa.Schema, given: StructType, fs: fsspec.AbstractFileSystem, root: str
    ) -> list[list[str]]:
        """The moves of every committed file of an append table, rewritten beside the attempt's staging
        directory with the input columns ``given`` that the ``table`` (its newest file's schema) lacks (one
        listing of the table; :func:`.parquet_schema.filled_files`); none if it lacks none."""
        added = parquet_schema.added_fields(table, given, None)
        if not added:
            return []
        listed = list_names(fs, root, "part-c")
        committed = {
            posixpath.basename(path): (path, size)
            for path, size in listed.items()
            if (m := APPEND_FILE.match(posixpath.basename(path))) and int(m[1]) < ctx.checkpoint_id
        }
        directory = self.clear(f"_staging/{self.staging_name(ctx)}-filled")  # beside the attempt's directory
        filled = parquet_schema.filled_files(fs, directory, added, committed)
        ctx.add_metric("sink_files_filled", len(filled))
        ctx.add_metric("sink_bytes_staged", sum(size for _, _, size in filled.values()))
        return [[path[len(root) + 1 :], name] for name, (path, _, _) in sorted(filled.items())]

    def write_upsert(self, ctx: StepContext, rows: UpsertRows) -> list[JsonDict]:
        assert self.upsert is not None  # upsert mode
        check_delete_column(self.uid, self.delete_when, rows.schema)
        listed = self._bucket_files()  # the step's one listing of the table
        # always: a merge reading bucket files of two schemas would keep one schema's columns (rows lost)
        table, missing = self._checked_table(rows.schema, listed)
        fs, root = self._fs()
        if missing.fields:  # a key keeps its values in them, as Delta's MERGE keeps them
            files = [
                missing_columns.TableFile(*f)
                for f in self._existing_buckets(list(range(self.buckets)), listed).values()
            ]
            rows = missing_columns.upsert_rows(f"Parquet table {self.asset_uri()}", fs, files, rows, missing)
        staging = self.attempt_staging(ctx)
        additive = table is not None and self.schema_evolution == "additive"
        filled = self._filled_buckets(ctx, table, rows.schema, fs, listed) if additive else []
        copies = {f.bucket: (f.path, f.size) for f in filled}

        def existing(buckets: list[int]) -> dict[int, tuple[str, int]]:  # the filled copy of a bucket, if any
            committed = self._existing_buckets([b for b in buckets if b not in copies], listed)
            return {**committed, **{b: copies[b] for b in buckets if b in copies}}

        staged = self.upsert.stage(ctx, rows, fs, staging, existing)
        merged = {s.bucket for s in staged}
        staged += [f for f in filled if f.bucket not in merged]
        ctx.add_metric("sink_bytes_staged", sum(s.size for s in staged))
        return self._committables(ctx, [[s.path[len(root) + 1 :], bucket_file(s.bucket)] for s in staged])

    def _filled_buckets(
        self, ctx: StepContext, table: pa.Schema, given: StructType, fs: fsspec.AbstractFileSystem, listed: Listing
    ) -> list[StagedBucket]:
        """Every committed bucket file, rewritten beside the attempt's staging directory with the input columns
        ``given`` that the ``table`` (its newest file's schema) lacks (:func:`.parquet_schema.filled_buckets`);
        none if it lacks none."""
        added = parquet_schema.added_fields(table, given, self.delete_when)
        if not added:
            return []
        committed = self._existing_buckets(list(range(self.buckets)), listed)
        directory = self.clear(f"_staging/{self.staging_name(ctx)}-filled")  # beside the merge's new directory
        filled = parquet_schema.filled_buckets(fs, directory, added, committed)
        ctx.add_metric("sink_buckets_filled", len(filled))
        return filled

    @staticmethod
    def _committables(ctx: StepContext, moves: list[list[str]]) -> list[JsonDict]:
        ctx.add_metric("sink_files_staged", len(moves))
        return [{"checkpoint_id": ctx.checkpoint_id, "moves": moves}]

    def _stage_append(
        self, ctx: StepContext, df: DataFrame, fs: fsspec.AbstractFileSystem, root: str, staging: str
    ) -> list[list[str]]:
        moves: list[list[str]] = []
        for file in write_parquet(df, fs, staging, held=self.held_input(ctx)):
            rows = file.row_count(fs)
            ctx.add_metric("sink_rows", rows)
            if rows:
                ctx.add_metric("sink_bytes_staged", file.size)
                target = f"part-c{ctx.checkpoint_id:010d}-{len(moves):05d}.parquet"
                moves.append([file.path[len(root) + 1 :], target])
        return moves

    def _bucket_files(self) -> Listing:
        """The table's committed bucket files with their sizes: one LIST."""
        table = self.table()
        return list_names(table.fs, table.base, "part-b")

    def _existing_buckets(self, buckets: list[int], listed: Listing) -> dict[int, tuple[str, int]]:
        """The committed files of ``buckets`` that exist in ``listed`` (:meth:`_bucket_files`), with their
        sizes; refused if one resolves outside the table."""
        table = self.table()
        paths = {b: table.path(bucket_file(b)) for b in buckets}
        return {b: (path, listed[path]) for b, path in paths.items() if path in listed}

    # -- phase two: commit or abort (in finalize / recovery) ---------------------------
    def is_committed(self, checkpoint_id: int) -> bool:
        """Whether ``_commits/<id>.json`` exists (one HEAD on S3)."""
        return self.table().has_file(self._commit_log(checkpoint_id))

    def read_committables(self, checkpoint_id: int, committables: Any, document: str) -> list[list[str]]:
        return check_table_committables(checkpoint_id, committables, self.mode, document)

    def commit_checked(self, checkpoint_id: int, committables: Any) -> None:
        """Publish the staged files into the table, log the commit, then delete the staging directory.

        Every move is checked first (shape, and on local filesystems that neither end
        resolves outside the table and that no staged file is or is reached through a link), so a
        forged committable moves nothing. Each file comes
        from the staging directory, else (a checkpoint restored after a rollback parked its
        output) from ``_rolled_back/chk-<id>/``; one listing of each tells which, and one that
        is in neither was published by an earlier attempt of this commit.
        """
        table = self.table()
        moves: list[list[str]] = committables
        parked = self._rolled_back(checkpoint_id)
        resolved = [
            (table.path(staged), table.path(f"{parked}/{target}"), table.path(target)) for staged, target in moves
        ]
        staging = table.path(self.staging_dir(checkpoint_id))
        table.path(self._commit_log(checkpoint_id))  # everything this commit touches is confined before the first move
        staged_files = list_tree(table.fs, staging)
        parked_files = {}
        if any(staged not in staged_files for staged, _, _ in resolved):
            parked_files = list_tree(table.fs, table.path(parked))
        listed = {**staged_files, **parked_files}
        what = f"staged file of sink {self.uid}"
        refuse_links(table.fs, staging, list(staged_files), what)  # a link anywhere in the staging: refused
        refuse_links(table.fs, table.path(parked), [p for s, p, _ in resolved if s not in staged_files], what)
        sources = [(staged if staged in staged_files else parked, target) for staged, parked, target in resolved]
        publish_all(table.fs, [(source, listed[source], target) for source, target in sources if source in listed])
        own = table_file_pattern(self.mode, checkpoint_id)  # the others: earlier files rewritten with a new column
        files = [t for _, t in moves if own.match(t)]
        log = {"checkpoint_id": checkpoint_id, "files": files, "commit_time": time.time()}
        table.write_atomic(self._commit_log(checkpoint_id), json.dumps(log).encode())
        self._logged[checkpoint_id] = log
        self.clear(self.staging_dir(checkpoint_id), staged_files)
        if parked_files:
            self.clear(parked, parked_files)

    def commit_record(self, checkpoint_id: int) -> dict[str, JsonDict]:
        """The commit time its commit log ``_commits/<id>.json`` holds (logs written before it had none):
        the log this process committed, else one GET."""
        log = self._logged.get(checkpoint_id)
        if log is None:
            table = self.table()
            try:
                data = read_document(table.fs, table.path(self._commit_log(checkpoint_id)))
                log = load_json(data, self._commit_log(checkpoint_id)) if data is not None else None
            except (OSError, CheckpointStorageError, DocumentError, UnsafePathError):
                return {}  # informational: an unreadable log records nothing
            if log is None:
                return {}
        when = log.get("commit_time") if isinstance(log, dict) else None
        return {self.uid: {"commit_time": when if type(when) is float else None}}

    def rollback(self, checkpoint_id: int) -> None:
        """Append mode: withdraw the files of checkpoints newer than ``checkpoint_id`` (they are replayed).

        Withdrawn files are parked under ``_rolled_back/<id>/``, so restoring one of those
        checkpoints later brings its output back. Upsert mode keeps the table: replaying
        from the restored state rewrites every key the newer checkpoints touched.
        """
        table = self.table()
        if self.mode != "append" or not table.exists("_commits"):
            return
        logs = [table.relative(p) for p in sorted(table.fs.glob(table.path("_commits") + "/*.json"))]
        for log in logs:
            newer, files = self._read_commit_log(table, log)
            if newer <= checkpoint_id:
                continue
            parked = self._rolled_back(newer)
            moves = [(table.path(name), table.path(f"{parked}/{name}")) for name in files]
            table.fs.makedirs(table.path(parked), exist_ok=True)
            for committed, parked_file in moves:
                if table.fs.exists(committed):
                    table.fs.mv(committed, parked_file)
            table.delete(log)
            self._logged.pop(newer, None)

    def _read_commit_log(self, table: Location, log: str) -> tuple[int, list[str]]:
        """A commit log ``_commits/<id>.json``: its checkpoint id and the table files it committed."""
        document = table.url(log)
        log_fields = Fields(load_json(table.read_bytes(log), document), document)
        checkpoint_id = log_fields.integer("checkpoint_id", 1)
        if posixpath.basename(log) != posixpath.basename(self._commit_log(checkpoint_id)):
            raise log_fields.error("checkpoint_id", "does not match the log's file name", checkpoint_id)
        pattern = table_file_pattern(self.mode, checkpoint_id)
        return checkpoint_id, log_fields.each(
            "files", lambda v, name: relative_path(v, document, name, pattern=pattern)
        )
