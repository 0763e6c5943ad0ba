"""A Parquet table with two-phase commit, readable by plain ``spark.read.parquet`` and pyarrow.

Table layout::

    <table>/part-*.parquet          committed data: all a reader sees
    <table>/_staging/chk-<id>/…     staged by steps; hidden from readers (leading ``_``)
    <table>/_commits/<id>.json      commit log: checkpoint <id> is committed

Staged files become visible by renaming each into place; a rename replaces a file
atomically, so a reader sees each file either whole or not at all, and never staged
data. Commit is idempotent: a logged checkpoint is skipped, a file already moved is not
moved again. Every path the sink reads, moves, creates or deletes goes through the
table's :class:`~airflow_provider_checkpoint.storage.Location`: a symlink in the table
(``_staging``, ``_commits``, ``_rolled_back``, a part file) that leads out of it is refused.
"""

from __future__ import annotations

import json
import posixpath
import re
import time
from typing import TYPE_CHECKING, Any

import fsspec

from airflow_provider_checkpoint.connectors.base.bucketed import (
    DRIVER_MERGE_ROWS,
    BucketedUpsert,
    bucket_file,
    check_buckets,
)
from airflow_provider_checkpoint.connectors.base.sink import TableDirectorySink, check_mode
from airflow_provider_checkpoint.connectors.base.upsert_rule import UpsertRows, check_sequence_by
from airflow_provider_checkpoint.core.documents import Fields, load_json, relative_path
from airflow_provider_checkpoint.core.model import JsonDict
from airflow_provider_checkpoint.dataflow.graph import Node
from airflow_provider_checkpoint.exceptions import CheckpointStorageError, DocumentError, UnsafePathError
from airflow_provider_checkpoint.fileio.writes import write_parquet
from airflow_provider_checkpoint.storage.job_storage import Location

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from airflow_provider_checkpoint.dataflow.context import StepContext

FORMAT = "parquet_table"
_APPEND_FILE = re.compile(r"^part-c(\d{10})-\d{5}\.parquet$")
_BUCKET_FILE = re.compile(r"^part-b\d{5}\.parquet$")


def table_file_pattern(mode: str, checkpoint_id: int) -> re.Pattern[str]:
    """Names of the committed files of ``checkpoint_id`` in a table of ``mode``."""
    return re.compile(rf"^part-c{checkpoint_id:010d}-\d{{5}}\.parquet$") if mode == "append" else _BUCKET_FILE


def check_table_committables(
    checkpoint_id: int, committables: Any, mode: str, document: str, field: str = "committables"
) -> list[list[str]]:
    """The moves of ``committables`` if they have exactly the shape :class:`ParquetTableSink` stages.

    ``{"checkpoint_id": <id>, "moves": [[staged, target], ...]}``: ``staged`` lies under
    ``_staging/chk-<id>/``, ``target`` is a file name of the table's own naming scheme for
    ``mode``, and no target appears twice.
    """
    reader = Fields({field: committables}, document)
    targets = table_file_pattern(mode, checkpoint_id)
    moves: list[list[str]] = []
    for i, item in enumerate(reader.items(field)):
        c = Fields(item, document, f"{field}[{i}]")
        if c.integer("checkpoint_id", 1) != checkpoint_id:
            raise c.error("checkpoint_id", f"must be {checkpoint_id}", c.raw["checkpoint_id"])
        for j, move in enumerate(c.items("moves")):
            where = f"{field}[{i}].moves[{j}]"
            if not isinstance(move, list) or len(move) != 2:
                raise DocumentError(document, where, "must be [staged, target]", move)
            staged = relative_path(move[0], document, f"{where}[0]", under=f"_staging/chk-{checkpoint_id}")
            target = relative_path(move[1], document, f"{where}[1]", pattern=targets)
            moves.append([staged, target])
    names = [t for _, t in moves]
    if len(set(names)) != len(names):
        raise DocumentError(document, field, "name a target file twice")
    return moves


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
        with pyarrow (no shuffle); ``0`` always merges with Spark.
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
    ) -> None:
        super().__init__(uid, input, path, storage_options, step)
        check_mode(uid, mode)
        self.mode = mode
        self.keys = list(keys or [])
        self.sequence_by = check_sequence_by(uid, mode, self.keys, sequence_by)
        self.buckets = buckets
        self.upsert = BucketedUpsert(uid, self.keys, buckets, driver_merge_rows) if mode == "upsert" else None
        check_buckets(uid, buckets, driver_merge_rows)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "format": FORMAT, "path": self.path, "mode": self.mode, "keys": self.keys}

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

    def write(self, ctx: StepContext, df: DataFrame) -> list[JsonDict]:
        fs, root = self._fs()
        return self._committables(ctx, self._stage_append(ctx, df, fs, root, self.attempt_staging(ctx)))

    def write_upsert(self, ctx: StepContext, rows: UpsertRows) -> list[JsonDict]:
        assert self.upsert is not None  # upsert mode
        fs, root = self._fs()
        staged = self.upsert.write(ctx, rows, fs, self.attempt_staging(ctx), self._existing_buckets)
        ctx.add_metric("sink_bytes_staged", sum(int(fs.size(path)) for _, path, _ in staged))
        return self._committables(ctx, [[path[len(root) + 1 :], bucket_file(b)] for b, path, _ in staged])

    @staticmethod
    def _committables(ctx: StepContext, moves: list[list[str]]) -> list[JsonDict]:
        ctx.add_metric("sink_files_staged", len(moves))
        return [{"checkpoint_id": ctx.checkpoint_id, "moves": moves}]

    def _stage_append(
        self, ctx: StepContext, df: DataFrame, fs: fsspec.AbstractFileSystem, root: str, staging: str
    ) -> list[list[str]]:
        moves: list[list[str]] = []
        for file in write_parquet(df, fs, staging):
            rows = file.row_count(fs)
            ctx.add_metric("sink_rows", rows)
            if rows:
                ctx.add_metric("sink_bytes_staged", file.size)
                target = f"part-c{ctx.checkpoint_id:010d}-{len(moves):05d}.parquet"
                moves.append([file.path[len(root) + 1 :], target])
        return moves

    def _existing_buckets(self, buckets: list[int]) -> dict[int, str]:
        """The committed files of ``buckets`` that exist (refused if one resolves outside the table)."""
        table = self.table()
        paths = {b: table.path(bucket_file(b)) for b in buckets}
        return {b: path for b, path in paths.items() if table.fs.exists(path)}

    # -- phase two: commit or abort (in finalize / recovery) ---------------------------
    def is_committed(self, checkpoint_id: int) -> bool:
        return self.table().exists(self._commit_log(checkpoint_id))

    def read_committables(self, checkpoint_id: int, committables: Any, document: str) -> list[list[str]]:
        return check_table_committables(checkpoint_id, committables, self.mode, document)

    def commit_checked(self, checkpoint_id: int, committables: Any) -> None:
        """Move the staged files into the table, then log the commit.

        Every move is checked first (shape, and on local filesystems that neither end
        resolves outside the table), so a forged committable moves nothing.
        """
        table = self.table()
        moves: list[list[str]] = committables
        parked = self._rolled_back(checkpoint_id)
        resolved = [
            (table.path(staged), table.path(f"{parked}/{target}"), table.path(target)) for staged, target in moves
        ]
        for touched in (self.staging_dir(checkpoint_id), parked, self._commit_log(checkpoint_id)):
            table.path(touched)  # everything this commit touches is confined before the first move
        for staged, parked_file, target in resolved:
            for source in (staged, parked_file):
                if table.fs.exists(source):
                    table.fs.mv(source, target)
                    break
        log = {"checkpoint_id": checkpoint_id, "files": [t for _, t in moves], "commit_time": time.time()}
        table.write_atomic(self._commit_log(checkpoint_id), json.dumps(log).encode())
        self.abort(checkpoint_id)
        table.delete(parked)

    def commit_record(self, checkpoint_id: int) -> dict[str, JsonDict]:
        """The commit time its commit log ``_commits/<id>.json`` holds (logs written before it had none)."""
        table = self.table()
        try:
            log = load_json(table.read_bytes(self._commit_log(checkpoint_id)), self._commit_log(checkpoint_id))
        except (OSError, CheckpointStorageError, DocumentError, UnsafePathError):
            return {}  # informational: a missing or unreadable log records nothing
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
