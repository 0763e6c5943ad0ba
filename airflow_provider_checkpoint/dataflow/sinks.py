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
from typing import TYPE_CHECKING, Any

import fsspec

from airflow_provider_checkpoint.core.documents import Fields, load_json, relative_path
from airflow_provider_checkpoint.core.model import JsonDict
from airflow_provider_checkpoint.dataflow.graph import Node, Sink
from airflow_provider_checkpoint.exceptions import DocumentError, PipelineDefinitionError
from airflow_provider_checkpoint.storage.job_storage import Location

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame

    from airflow_provider_checkpoint.spark.context import StepContext

_BUCKET = "_bucket"
FORMAT = "parquet_table"
_APPEND_FILE = re.compile(r"^part-c(\d{10})-\d{5}\.parquet$")
_BUCKET_FILE = re.compile(r"^part-b\d{5}\.parquet$")
DRIVER_MERGE_ROWS = 250_000
"""Upserts of at most this many rows merge each bucket in the driver (pyarrow, no shuffle)."""


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


class ParquetTableSink(Sink):
    """Exactly-once Parquet table in ``append`` or ``upsert`` (by ``keys``) mode.

    ``append`` adds the checkpoint's rows as new files ``part-c<checkpoint>-<n>.parquet``.
    ``upsert`` hashes ``keys`` into ``buckets`` files ``part-b<bucket>.parquet`` and
    rewrites only the buckets whose keys changed, replacing each atomically: a key is in
    the table exactly once (a null key too). One job writes a table.

    An upsert of at most ``driver_merge_rows`` changed rows collects them to the driver
    and merges each affected bucket there with pyarrow, streaming the old file (no Spark
    shuffle; memory: the changed rows plus one batch). Larger upserts, or ``0``, rewrite
    the buckets with Spark, one shuffle of the old and changed rows.
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
    ) -> None:
        super().__init__(uid, input, step)
        if mode not in ("append", "upsert"):
            raise PipelineDefinitionError(f"{uid}: mode must be 'append' or 'upsert', got {mode!r}")
        if mode == "upsert" and not keys:
            raise PipelineDefinitionError(f"{uid}: upsert mode needs keys")
        if not 1 <= buckets <= 4096:
            raise PipelineDefinitionError(f"{uid}: buckets must be in [1, 4096]")
        if driver_merge_rows < 0:
            raise PipelineDefinitionError(f"{uid}: driver_merge_rows must not be negative")
        self.path = path
        self.mode = mode
        self.keys = list(keys or [])
        self.buckets = buckets
        self.driver_merge_rows = driver_merge_rows
        self.storage_options = dict(storage_options or {})

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "format": FORMAT, "path": self.path, "mode": self.mode, "keys": self.keys}

    # -- paths -------------------------------------------------------------------------
    def _fs(self) -> tuple[fsspec.AbstractFileSystem, str]:
        fs, root = fsspec.core.url_to_fs(self.path, **self.storage_options)
        if "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
            root = posixpath.abspath(root)
        return fs, root.rstrip("/")

    def table(self) -> Location:
        """The table directory: every path in it is confined to it (``..``, absolute, a symlink out)."""
        return Location(*self._fs())

    def _url(self, path: str) -> str:
        fs, _ = self._fs()
        protocol = fs.protocol[0] if isinstance(fs.protocol, tuple) else fs.protocol
        return f"{'file' if protocol in ('file', 'local') else protocol}://{path}"

    def asset_uri(self) -> str:
        return self._url(self._fs()[1])

    @staticmethod
    def _staging(checkpoint_id: int) -> str:
        return f"_staging/chk-{checkpoint_id}"

    @staticmethod
    def _rolled_back(checkpoint_id: int) -> str:
        return f"_rolled_back/chk-{checkpoint_id}"

    @staticmethod
    def _commit_log(checkpoint_id: int) -> str:
        return f"_commits/{checkpoint_id:010d}.json"

    # -- phase one: stage (in the step) ------------------------------------------------
    def _claim(self, job_id: str) -> None:
        """Record this job and sink as the table's only writer; refuse another or a changed layout."""
        table = self.table()
        claim = {"job_id": job_id, "sink": self.uid, "mode": self.mode, "keys": self.keys, "buckets": self.buckets}
        if not self.keys:
            claim.pop("buckets")
        if table.exists("_table.json"):
            existing = load_json(table.read_bytes("_table.json"), table.url("_table.json"))
            if existing != claim:
                raise PipelineDefinitionError(
                    f"sink {self.uid}: table {self.asset_uri()} belongs to {existing}, not {claim}; "
                    "one job and sink write a table, and its mode, keys and buckets cannot change"
                )
            return
        table.write_atomic("_table.json", json.dumps(claim, sort_keys=True).encode())

    def stage(self, ctx: StepContext, df: DataFrame) -> list[JsonDict]:
        fs, root = self._fs()
        self._claim(ctx.plan.job_id)
        staging = self.table().path(f"{self._staging(ctx.checkpoint_id)}/{ctx.attempt_tag}")
        if fs.exists(staging):
            fs.rm(staging, recursive=True)
        if self.mode == "append":
            moves = self._stage_append(ctx, df, fs, root, staging)
        else:
            moves = self._stage_upsert(ctx, df, fs, root, staging)
        ctx.add_metric("sink_files_staged", len(moves))
        return [{"checkpoint_id": ctx.checkpoint_id, "moves": moves}]

    def _stage_append(
        self, ctx: StepContext, df: DataFrame, fs: fsspec.AbstractFileSystem, root: str, staging: str
    ) -> list[list[str]]:
        import pyarrow.parquet as pq

        df.write.parquet(self._url(staging))
        moves: list[list[str]] = []
        for full in sorted(fs.glob(f"{staging}/part-*.parquet")):
            with fs.open(full, "rb") as f:
                rows = pq.ParquetFile(f).metadata.num_rows
            ctx.add_metric("sink_rows", rows)
            if rows:
                target = f"part-c{ctx.checkpoint_id:010d}-{len(moves):05d}.parquet"
                moves.append([full[len(root) + 1 :], target])
        return moves

    def _stage_upsert(
        self, ctx: StepContext, df: DataFrame, fs: fsspec.AbstractFileSystem, root: str, staging: str
    ) -> list[list[str]]:
        changed = df.withColumn(_BUCKET, self._bucket_of())
        if self.driver_merge_rows:
            small = changed.limit(self.driver_merge_rows + 1).toArrow()
            if small.num_rows <= self.driver_merge_rows:
                moves = self._merge_in_driver(ctx, small, fs, root, staging)
                if moves is not None:
                    return moves
        return self._merge_in_spark(ctx, changed, fs, root, staging)

    def _merge_in_driver(
        self, ctx: StepContext, changed: pa.Table, fs: fsspec.AbstractFileSystem, root: str, staging: str
    ) -> list[list[str]] | None:
        """Each affected bucket merged with pyarrow (:mod:`.bucket_merge`); ``None`` if a file's columns differ."""
        import numpy as np

        from airflow_provider_checkpoint.dataflow import bucket_merge

        rows = changed.num_rows
        changed = changed.take(np.argsort(changed[_BUCKET].to_numpy(), kind="stable"))
        affected, starts, counts = np.unique(changed[_BUCKET].to_numpy(), return_index=True, return_counts=True)
        changed = changed.drop_columns([_BUCKET])
        old = self._existing_buckets(affected.tolist())
        if not bucket_merge.mergeable(fs, list(old.values()), changed.schema, self.keys):
            return None
        ctx.add_metric("sink_rows", rows)
        fs.makedirs(staging, exist_ok=True)
        moves: list[list[str]] = []
        for b, start, count in zip(affected.tolist(), starts.tolist(), counts.tolist(), strict=True):
            out = f"{staging}/{self._bucket_file(b)}"
            bucket_merge.merge_bucket(fs, old.get(b), changed.slice(start, count), self.keys, out)
            moves.append([out[len(root) + 1 :], self._bucket_file(b)])
        return moves

    def _merge_in_spark(
        self, ctx: StepContext, changed: DataFrame, fs: fsspec.AbstractFileSystem, root: str, staging: str
    ) -> list[list[str]]:
        """Every affected bucket rewritten by Spark: one shuffle of the old and changed rows by bucket."""
        from airflow_provider_checkpoint.dataflow.keyed_join import keys_match, other_side

        changed = changed.cache()
        per_bucket = {int(r[0]): int(r[1]) for r in changed.groupBy(_BUCKET).count().collect()}
        affected = sorted(per_bucket)
        ctx.add_metric("sink_rows", sum(per_bucket.values()))
        if not affected:
            changed.unpersist()
            return []
        existing = list(self._existing_buckets(affected).values())
        merged = changed
        if existing:
            old = ctx.spark.read.parquet(*[self._url(p) for p in existing]).withColumn(_BUCKET, self._bucket_of())
            kept = old.join(other_side(changed.select(*self.keys)), keys_match(self.keys), "left_anti")
            merged = kept.unionByName(changed, allowMissingColumns=True)
        # one file per bucket: every bucket's rows in one task (hashing, so no pass to sample range bounds)
        merged.repartition(len(affected), _BUCKET).write.partitionBy(_BUCKET).parquet(self._url(staging))
        changed.unpersist()
        moves: list[list[str]] = []
        for b in affected:
            files = fs.glob(f"{staging}/{_BUCKET}={b}/part-*.parquet")
            if len(files) != 1:
                raise RuntimeError(f"sink {self.uid}: expected one staged file for bucket {b}, found {len(files)}")
            moves.append([files[0][len(root) + 1 :], self._bucket_file(b)])
        return moves

    def _bucket_of(self) -> Column:
        """The bucket of a row: a hash of its keys (stable across Spark versions)."""
        from pyspark.sql import functions as F

        return F.pmod(F.xxhash64(*[F.col(k) for k in self.keys]), F.lit(self.buckets))

    def _existing_buckets(self, buckets: list[int]) -> dict[int, str]:
        """The committed files of ``buckets`` that exist (refused if one resolves outside the table)."""
        table = self.table()
        paths = {b: table.path(self._bucket_file(b)) for b in buckets}
        return {b: path for b, path in paths.items() if table.fs.exists(path)}

    @staticmethod
    def _bucket_file(bucket: int) -> str:
        return f"part-b{bucket:05d}.parquet"

    # -- phase two: commit or abort (in finalize / recovery) ---------------------------
    def is_committed(self, checkpoint_id: int) -> bool:
        return self.table().exists(self._commit_log(checkpoint_id))

    def check_committables(self, checkpoint_id: int, committables: list[JsonDict], document: str) -> None:
        check_table_committables(checkpoint_id, committables, self.mode, document)

    def commit(self, checkpoint_id: int, committables: list[JsonDict]) -> None:
        """Move the staged files into the table, then log the commit; idempotent.

        Every move is checked first (shape, and on local filesystems that neither end
        resolves outside the table), so a forged committable moves nothing.
        """
        table = self.table()
        if self.is_committed(checkpoint_id):
            return
        document = f"committables of sink {self.uid} for checkpoint {checkpoint_id}"
        moves = check_table_committables(checkpoint_id, committables, self.mode, document)
        parked = self._rolled_back(checkpoint_id)
        resolved = [
            (table.path(staged), table.path(f"{parked}/{target}"), table.path(target)) for staged, target in moves
        ]
        for touched in (self._staging(checkpoint_id), parked, self._commit_log(checkpoint_id)):
            table.path(touched)  # everything this commit touches is confined before the first move
        for staged, parked_file, target in resolved:
            for source in (staged, parked_file):
                if table.fs.exists(source):
                    table.fs.mv(source, target)
                    break
        log = {"checkpoint_id": checkpoint_id, "files": [t for _, t in moves]}
        table.write_atomic(self._commit_log(checkpoint_id), json.dumps(log).encode())
        self.abort(checkpoint_id)
        table.delete(parked)

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

    def abort(self, checkpoint_id: int) -> None:
        self.table().delete(self._staging(checkpoint_id))
