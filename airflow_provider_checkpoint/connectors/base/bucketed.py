"""Upsert by key into hash buckets: only the buckets whose keys changed are rewritten.

A row's bucket is a hash of its keys modulo ``buckets``; each bucket is one file. An upsert
writes, per affected bucket, the old file's rows whose key did not change plus the
changed rows: a key is in the table exactly once (a null key too), and the cost grows with
the changed keys' buckets, not the table.

Small upserts (at most ``driver_merge_rows`` changed rows) are merged in the driver with
pyarrow (:mod:`.bucket_merge`, no Spark shuffle; memory: the changed rows plus one batch and
one small old file); larger ones, or ``0``, by Spark, one shuffle of the old and changed rows.
A first load (no bucket file yet) of at most :data:`FIRST_LOAD_FACTOR` times as many rows,
counted upstream, is written by the driver too (one Spark job collects the rows, no shuffle).
Either way each affected bucket's old file is read once, without a HEAD (its size comes from
the caller's listing), and the staged files' sizes are known from writing them.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from airflow_provider_checkpoint.connectors.base.file_threads import each_file
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError
from airflow_provider_checkpoint.fileio.scans import read_parquet
from airflow_provider_checkpoint.fileio.writes import WrittenFile, write_parquet
from airflow_provider_checkpoint.storage.object_store import is_s3

if TYPE_CHECKING:
    import fsspec
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame

    from airflow_provider_checkpoint.connectors.base.upsert_rule import UpsertRows
    from airflow_provider_checkpoint.dataflow.context import StepContext

_BUCKET = "_bucket"
DRIVER_MERGE_ROWS = 250_000
"""Upserts of at most this many rows merge each bucket in the driver (pyarrow, no shuffle)."""
FIRST_LOAD_FACTOR = 8
"""A first load of at most this many times ``driver_merge_rows`` rows (their count known before the sink
runs, e.g. a first state's rows), and at most :data:`FIRST_LOAD_BYTES` by Spark's estimate, is written by
the driver (pyarrow; memory: the rows as Arrow): lowering ``driver_merge_rows`` for wide rows lowers it."""
FIRST_LOAD_BYTES = 128 << 20
MERGE_THREADS = 4
"""Buckets merged at once on an object store (each reads its old file and writes the new one: round trips)."""


class StagedBucket(NamedTuple):
    """A bucket's staged file: its ``path``, ``rows`` (known when the driver merged it, else ``None``)
    and ``size`` in bytes."""

    bucket: int
    path: str
    rows: int | None
    size: int


ExistingBuckets = Callable[[list[int]], dict[int, tuple[str, int]]]
"""The committed file of each of the given buckets that has one: ``(path on the table's filesystem, size)``."""


@dataclass(frozen=True)
class BucketedUpsert:
    """The upsert writer of a bucketed table; :meth:`stage` returns a :class:`StagedBucket` per affected bucket."""

    uid: str
    keys: list[str]
    buckets: int
    driver_merge_rows: int = DRIVER_MERGE_ROWS
    delete_when: str | None = None
    """A boolean input column: a row where it is true deletes its key (written nowhere, the column neither)."""

    def __post_init__(self) -> None:
        if not self.keys:
            raise PipelineDefinitionError(f"{self.uid}: upsert mode needs keys")
        check_buckets(self.uid, self.buckets, self.driver_merge_rows)

    def stage(
        self,
        ctx: StepContext,
        rows: UpsertRows,
        fs: fsspec.AbstractFileSystem,
        staging: str,
        existing: ExistingBuckets,
    ) -> list[StagedBucket]:
        """Merge ``rows`` (the changed rows) into the affected buckets, staged under ``staging``."""
        small = self.in_driver(rows)
        if small is not None:
            staged = self._merge_in_driver(ctx, small, fs, staging, existing)
            if staged is not None:
                return staged
        committed = existing(list(range(self.buckets)))
        if not committed and small is None:  # a first load: no old file to read
            first = self.first_load_in_driver(rows)
            staged = None if first is None else self._merge_in_driver(ctx, first, fs, staging, lambda _: {})
            if staged is not None:
                return staged
        return self._merge_in_spark(ctx, rows.frame().withColumn(_BUCKET, self.bucket_of()), fs, staging, committed)

    def in_driver(self, rows: UpsertRows) -> pa.Table | None:
        """The changed rows in the driver, with their ``_bucket``: as the driver holds them already (any
        number), or collected in one Spark job if at most ``driver_merge_rows``; ``None``: merge in Spark."""
        if not self.driver_merge_rows:
            return None
        held = rows.held(_BUCKET, self.buckets)
        return held if held is not None else rows.collect(self.driver_merge_rows, (_BUCKET, self.buckets))

    def first_load_in_driver(self, rows: UpsertRows) -> pa.Table | None:
        """The rows of a first load in the driver, with their ``_bucket``, collected in one Spark job when
        counted upstream at most :data:`FIRST_LOAD_FACTOR` times ``driver_merge_rows`` (:meth:`in_driver`
        collects up to ``driver_merge_rows``) and at most :data:`FIRST_LOAD_BYTES` (Spark's estimate, or the
        size of rows read on the driver); ``None``:
        Spark writes them."""
        limit = FIRST_LOAD_FACTOR * self.driver_merge_rows
        if not limit or rows.count is None or rows.count > limit:
            return None
        size = rows.estimated_bytes()
        if size is None or size > FIRST_LOAD_BYTES:
            return None
        return rows.collect(limit, (_BUCKET, self.buckets))

    def _merge_in_driver(
        self,
        ctx: StepContext,
        changed: pa.Table,
        fs: fsspec.AbstractFileSystem,
        staging: str,
        existing: ExistingBuckets,
    ) -> list[StagedBucket] | None:
        """Each affected bucket merged with pyarrow; ``None`` (nothing left staged) if the keys' types or
        an old file's columns differ (:func:`.bucket_merge.mergeable`, checked as each file is read)."""
        import numpy as np

        from airflow_provider_checkpoint.connectors.base import bucket_merge
        from airflow_provider_checkpoint.fileio.arrow_numpy import arrow_of, numpy_of

        if not bucket_merge.keys_mergeable(changed.schema, self.keys):
            return None
        changed = changed.take(arrow_of(np.argsort(numpy_of(changed[_BUCKET]), kind="stable")))
        affected, starts, counts = np.unique(numpy_of(changed[_BUCKET]), return_index=True, return_counts=True)
        changed = changed.drop_columns([_BUCKET])
        written = changed.drop_columns([self.delete_when]) if self.delete_when else changed
        old = existing(affected.tolist())
        if not is_s3(fs):  # object stores have no directories to make
            fs.makedirs(staging, exist_ok=True)

        def merge(b: int, start: int, count: int) -> StagedBucket | None:
            out = f"{staging}/{bucket_file(b)}"
            with bucket_merge.open_parquet(fs, *old[b]) if b in old else nullcontext() as reader:
                if reader is not None and not bucket_merge.mergeable(reader.schema_arrow, written.schema):
                    return None
                rows = changed.slice(start, count)
                merged, size = bucket_merge.merge_bucket(fs, reader, rows, self.keys, out, self.delete_when)
            return StagedBucket(b, out, merged, size)

        buckets = list(zip(affected.tolist(), starts.tolist(), counts.tolist(), strict=True))
        # on an object store each bucket's read and write are round trips: overlap them
        staged = each_file(lambda bucket: merge(*bucket), buckets, MERGE_THREADS if is_s3(fs) else 1)
        if any(bucket is None for bucket in staged):
            if fs.exists(staging):  # Spark writes a new directory
                fs.rm(staging, recursive=True)
            return None
        ctx.add_metric("sink_rows", changed.num_rows)
        return [bucket for bucket in staged if bucket is not None]

    def _merge_in_spark(
        self,
        ctx: StepContext,
        changed: DataFrame,
        fs: fsspec.AbstractFileSystem,
        staging: str,
        committed: dict[int, tuple[str, int]],
    ) -> list[StagedBucket]:
        """Every affected bucket rewritten by Spark: one shuffle of the old and changed rows by bucket.
        Into a table with no bucket file yet (``committed`` empty: a first load), the rows are written
        in that one pass: no job first to find the affected buckets."""
        from airflow_provider_checkpoint.dataflow.keyed_join import keys_match, other_side

        if not committed:
            return self._first_load(ctx, self.kept(changed), fs, staging)
        changed = changed.cache()
        per_bucket = {int(r[0]): int(r[1]) for r in changed.groupBy(_BUCKET).count().collect()}
        affected = sorted(per_bucket)
        ctx.add_metric("sink_rows", sum(per_bucket.values()))
        if not affected:
            changed.unpersist()
            return []
        old_files = [committed[b][0] for b in affected if b in committed]
        merged = self.kept(changed)  # built once: its schema and the union below share one plan
        if old_files:
            # the old rows read with the written columns: a column an old file lacks is null, never another
            # file's columns dropped (a scan takes one file's schema when given none)
            columns = merged.drop(_BUCKET).schema
            old = read_parquet(ctx.spark, fs, old_files, columns).withColumn(_BUCKET, self.bucket_of())
            kept = old.join(other_side(changed.select(*self.keys)), keys_match(self.keys), "left_anti")
            merged = kept.unionByName(merged, allowMissingColumns=True)
        # one file per bucket: every bucket's rows in one task (hashing, so no pass to sample range bounds)
        written = write_parquet(merged.repartition(len(affected), _BUCKET), fs, staging, (_BUCKET,))
        written += self._emptied(fs, staging, merged, written, affected)
        changed.unpersist()
        return self._one_file_each(written, affected)

    def kept(self, changed: DataFrame) -> DataFrame:
        """``changed`` without the rows that delete their key, and without the ``delete_when`` column."""
        from pyspark.sql import functions as F

        if self.delete_when is None:
            return changed
        return changed.where(~F.coalesce(F.col(self.delete_when), F.lit(False))).drop(self.delete_when)

    def _emptied(
        self,
        fs: fsspec.AbstractFileSystem,
        staging: str,
        merged: DataFrame,
        written: list[WrittenFile],
        affected: list[int],
    ) -> list[WrittenFile]:
        """An empty file staged for each affected bucket whose every row was deleted (Spark writes no file
        for it), so the commit replaces its old file."""
        import pyarrow.parquet as pq
        from pyspark.sql.pandas.types import to_arrow_schema

        if self.delete_when is None:
            return []
        have = {f.partition for f in written}
        schema = to_arrow_schema(merged.drop(_BUCKET).schema, timezone="UTC")  # as Spark writes timestamps
        out = []
        for b in (b for b in affected if (str(b),) not in have):
            directory = f"{staging}/{_BUCKET}={b}"
            if not is_s3(fs):
                fs.makedirs(directory, exist_ok=True)
            with fs.open(f"{directory}/empty.parquet", "wb") as f:
                pq.write_table(schema.empty_table(), f)
            out.append(
                WrittenFile(f"{directory}/empty.parquet", fs.size(f"{directory}/empty.parquet"), 0, None, (str(b),))
            )
        return out

    def _first_load(
        self, ctx: StepContext, changed: DataFrame, fs: fsspec.AbstractFileSystem, staging: str
    ) -> list[StagedBucket]:
        """Every bucket of ``changed`` written by Spark in one pass (rows counted on that pass)."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        from airflow_provider_checkpoint.dataflow.observation import observed_metrics

        observation, rows = Observation(), F.count(F.lit(1)).alias("rows")
        observed = changed.observe(observation, rows)
        written = write_parquet(observed.repartition(self.buckets, _BUCKET), fs, staging, (_BUCKET,))
        ctx.add_metric("sink_rows", int(observed_metrics(observation, lambda: changed.agg(rows).first())["rows"]))
        return self._one_file_each(written, sorted({int(f.partition[0] or 0) for f in written}))

    def _one_file_each(self, written: list[WrittenFile], buckets: list[int]) -> list[StagedBucket]:
        """The staged file of each of ``buckets`` among the ``written`` files; exactly one each."""
        staged: list[StagedBucket] = []
        for b in buckets:
            files = [f for f in written if f.partition == (str(b),)]
            if len(files) != 1:
                raise RuntimeError(f"sink {self.uid}: expected one staged file for bucket {b}, found {len(files)}")
            staged.append(StagedBucket(b, files[0].path, None, files[0].size))
        return staged

    def bucket_of(self) -> Column:
        """The bucket of a row: a hash of its keys (stable across Spark versions)."""
        from pyspark.sql import functions as F

        return F.pmod(F.xxhash64(*[F.col(k) for k in self.keys]), F.lit(self.buckets))


def check_buckets(uid: str, buckets: int, driver_merge_rows: int) -> None:
    """Refuse a bucket count outside [1, 4096] or a negative ``driver_merge_rows``."""
    if not 1 <= buckets <= 4096:
        raise PipelineDefinitionError(f"{uid}: buckets must be in [1, 4096]")
    if driver_merge_rows < 0:
        raise PipelineDefinitionError(f"{uid}: driver_merge_rows must not be negative")


def bucket_file(bucket: int) -> str:
    """The file name of ``bucket``."""
    return f"part-b{bucket:05d}.parquet"
