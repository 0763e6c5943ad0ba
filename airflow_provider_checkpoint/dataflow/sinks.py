"""A Parquet table with two-phase commit, readable by plain ``spark.read.parquet`` and pyarrow.

Table layout::

    <table>/part-*.parquet          committed data: all a reader sees
    <table>/_staging/chk-<id>/…     staged by steps; hidden from readers (leading ``_``)
    <table>/_commits/<id>.json      commit log: checkpoint <id> is committed

Staged files become visible by renaming each into place; a rename replaces a file
atomically, so a reader sees each file either whole or not at all, and never staged
data. Commit is idempotent: a logged checkpoint is skipped, a file already moved is not
moved again.
"""

from __future__ import annotations

import json
import posixpath
from typing import TYPE_CHECKING, Any

import fsspec

from airflow_provider_checkpoint.core.model import JsonDict
from airflow_provider_checkpoint.dataflow.graph import Node, PipelineDefinitionError, Sink
from airflow_provider_checkpoint.storage.job_storage import write_atomic

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from airflow_provider_checkpoint.spark.context import StepContext

_BUCKET = "_bucket"


class ParquetTableSink(Sink):
    """Exactly-once Parquet table in ``append`` or ``upsert`` (by ``keys``) mode.

    ``append`` adds the checkpoint's rows as new files ``part-c<checkpoint>-<n>.parquet``.
    ``upsert`` hashes ``keys`` into ``buckets`` files ``part-b<bucket>.parquet`` and
    rewrites only the buckets whose keys changed, replacing each atomically: a key is in
    the table exactly once. One job writes a table.
    """

    def __init__(
        self,
        uid: str,
        input: Node,
        path: str,
        mode: str = "append",
        keys: list[str] | None = None,
        buckets: int = 8,
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
        self.path = path
        self.mode = mode
        self.keys = list(keys or [])
        self.buckets = buckets
        self.storage_options = dict(storage_options or {})

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "path": self.path, "mode": self.mode, "keys": self.keys}

    # -- paths -------------------------------------------------------------------------
    def _fs(self) -> tuple[fsspec.AbstractFileSystem, str]:
        fs, root = fsspec.core.url_to_fs(self.path, **self.storage_options)
        if "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
            root = posixpath.abspath(root)
        return fs, root.rstrip("/")

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
        fs, root = self._fs()
        claim = {"job_id": job_id, "sink": self.uid, "mode": self.mode, "keys": self.keys, "buckets": self.buckets}
        if not self.keys:
            claim.pop("buckets")
        path = f"{root}/_table.json"
        if fs.exists(path):
            existing = json.loads(fs.cat_file(path))
            if existing != claim:
                raise PipelineDefinitionError(
                    f"sink {self.uid}: table {self.asset_uri()} belongs to {existing}, not {claim}; "
                    "one job and sink write a table, and its mode, keys and buckets cannot change"
                )
            return
        write_atomic(fs, path, json.dumps(claim, sort_keys=True).encode())

    def stage(self, ctx: StepContext, df: DataFrame) -> list[JsonDict]:
        fs, root = self._fs()
        self._claim(ctx.plan.job_id)
        staging = f"{root}/{self._staging(ctx.checkpoint_id)}/{ctx.attempt_tag}"
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
        from pyspark.sql import functions as F

        bucket = F.pmod(F.xxhash64(*[F.col(k) for k in self.keys]), F.lit(self.buckets))
        changed = df.withColumn(_BUCKET, bucket).cache()
        per_bucket = {int(r[0]): int(r[1]) for r in changed.groupBy(_BUCKET).count().collect()}
        affected = sorted(per_bucket)
        ctx.add_metric("sink_rows", sum(per_bucket.values()))
        if not affected:
            changed.unpersist()
            return []
        existing = [f"{root}/{self._bucket_file(b)}" for b in affected if fs.exists(f"{root}/{self._bucket_file(b)}")]
        merged = changed
        if existing:
            old = ctx.spark.read.parquet(*[self._url(p) for p in existing]).withColumn(_BUCKET, bucket)
            kept = old.join(changed.select(*self.keys), self.keys, "left_anti")
            merged = kept.unionByName(changed, allowMissingColumns=True)
        # range partitioning gives each affected bucket a task of its own (hashing would pile several on one)
        merged.repartitionByRange(len(affected), _BUCKET).write.partitionBy(_BUCKET).parquet(self._url(staging))
        changed.unpersist()
        moves: list[list[str]] = []
        for b in affected:
            files = fs.glob(f"{staging}/{_BUCKET}={b}/part-*.parquet")
            if len(files) != 1:
                raise RuntimeError(f"sink {self.uid}: expected one staged file for bucket {b}, found {len(files)}")
            moves.append([files[0][len(root) + 1 :], self._bucket_file(b)])
        return moves

    @staticmethod
    def _bucket_file(bucket: int) -> str:
        return f"part-b{bucket:05d}.parquet"

    # -- phase two: commit or abort (in finalize / recovery) ---------------------------
    def is_committed(self, checkpoint_id: int) -> bool:
        fs, root = self._fs()
        return bool(fs.exists(f"{root}/{self._commit_log(checkpoint_id)}"))

    def commit(self, checkpoint_id: int, committables: list[JsonDict]) -> None:
        fs, root = self._fs()
        if self.is_committed(checkpoint_id):
            return
        parked = f"{root}/{self._rolled_back(checkpoint_id)}"
        for committable in committables:
            for staged, target in committable["moves"]:
                for source in (f"{root}/{staged}", f"{parked}/{target}"):
                    if fs.exists(source):
                        fs.mv(source, f"{root}/{target}")
                        break
        log = {"checkpoint_id": checkpoint_id, "files": [t for c in committables for _, t in c["moves"]]}
        write_atomic(fs, f"{root}/{self._commit_log(checkpoint_id)}", json.dumps(log).encode())
        self.abort(checkpoint_id)
        if fs.exists(parked):
            fs.rm(parked, recursive=True)

    def rollback(self, checkpoint_id: int) -> None:
        """Append mode: withdraw the files of checkpoints newer than ``checkpoint_id`` (they are replayed).

        Withdrawn files are parked under ``_rolled_back/<id>/``, so restoring one of those
        checkpoints later brings its output back. Upsert mode keeps the table: replaying
        from the restored state rewrites every key the newer checkpoints touched.
        """
        fs, root = self._fs()
        if self.mode != "append" or not fs.exists(f"{root}/_commits"):
            return
        for log_path in sorted(fs.glob(f"{root}/_commits/*.json")):
            log = json.loads(fs.cat_file(log_path))
            newer = int(log["checkpoint_id"])
            if newer <= checkpoint_id:
                continue
            parked = f"{root}/{self._rolled_back(newer)}"
            fs.makedirs(parked, exist_ok=True)
            for name in log["files"]:
                if fs.exists(f"{root}/{name}"):
                    fs.mv(f"{root}/{name}", f"{parked}/{name}")
            fs.rm(log_path)

    def abort(self, checkpoint_id: int) -> None:
        fs, root = self._fs()
        staging = f"{root}/{self._staging(checkpoint_id)}"
        if fs.exists(staging):
            fs.rm(staging, recursive=True)
