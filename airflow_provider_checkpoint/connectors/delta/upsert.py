"""Upsert of a Delta table by deletion vectors (merge-on-read): the step side.

A checkpoint's upsert writes its changed rows once, as new *update files*
(``part-u<checkpoint>-<n>.parquet``, by Spark), and deletes the rows they replace with
deletion vectors: for each earlier file holding a changed key, the positions of those rows
(and of the rows its DV deleted before) become its new DV: inline in the log when small, else in
one DV file of the attempt. Nothing else
is rewritten, so the bytes written grow with the changed keys, not the table.

Where a changed key can be: the bucket file (``part-b<bucket>``) of its bucket and any
update file. Their key columns are read with pyarrow, a few files at a time, batch by
batch (memory: the changed keys plus one batch per thread; :mod:`.lookups`); the table is never loaded.

Compaction: a file whose deleted rows reach :data:`COMPACT_FRACTION` of its rows is
rewritten with its live rows in the same checkpoint (remove + add, no DV), so a read never
decodes more than twice a file's live rows and DV files stay small. A file with fewer
deletes keeps its bytes and only its DV changes. Once a table has more than
:data:`MAX_UPDATE_FILES` update files, a checkpoint merges them into one (their live rows,
remove + add): every upsert reads the keys of every update file, so their number, and the
requests of a checkpoint on an object store, stay bounded however old the table is.
"""

from __future__ import annotations

import dataclasses
import math
import posixpath
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from airflow_provider_checkpoint.connectors.base.bucket_merge import BATCH_ROWS, KeySet, kept_rows, table_writer
from airflow_provider_checkpoint.connectors.base.bucketed import BucketedUpsert
from airflow_provider_checkpoint.connectors.base.file_threads import each_file
from airflow_provider_checkpoint.connectors.delta import checks as delta_checks
from airflow_provider_checkpoint.connectors.delta import deletion_vectors
from airflow_provider_checkpoint.connectors.delta.files import (
    DeltaDeletes,
    DeltaFile,
    bucket_of_path,
    update_file,
)
from airflow_provider_checkpoint.connectors.delta.log import DataFile, dv_id
from airflow_provider_checkpoint.connectors.delta.lookups import Found, Lookup, ReadAhead, deleted_positions, pq_file
from airflow_provider_checkpoint.fileio.arrow_numpy import arrow_of, numpy_of
from airflow_provider_checkpoint.fileio.writes import write_parquet
from airflow_provider_checkpoint.storage.object_store import open_sized

if TYPE_CHECKING:
    import fsspec
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import DataFrame

    from airflow_provider_checkpoint.connectors.base.upsert_rule import UpsertRows
    from airflow_provider_checkpoint.dataflow.context import StepContext

COMPACT_FRACTION = 0.5
"""A file with at least this fraction of its rows deleted is rewritten with its live rows."""
UPDATE_FILE_ROWS = 1_000_000
"""Rows per update file Spark writes (coalesced to ``ceil(rows / this)`` files)."""
INLINE_DV_BYTES = 2048
"""With ``inline_deletion_vectors``, DVs up to this size go inline into the log (Z85: 5/4 of it); larger
ones into the checkpoint's DV file. Inline DVs spare a reader one file read per data file, but
delta-spark 4.4's ``VACUUM`` fails on them (``scala.MatchError``): DV files are the default."""
MAX_UPDATE_FILES = 8
"""Update files an upsert table has at most after a checkpoint, but for that checkpoint's own."""
_BUCKET = "_bucket"


@dataclass
class StagedUpsert:
    """What an upsert staged: new files (staged path, rows if known), removes and DV deletes."""

    adds: list[tuple[str, int | None]]
    removes: list[DeltaFile]
    deletes: list[DeltaDeletes]
    known: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    """The positions of the table's DVs the lookups decoded, by DV id (:func:`.log.dv_id`)."""


def stage(
    ctx: StepContext,
    upsert: BucketedUpsert,
    rows: UpsertRows,
    fs: fsspec.AbstractFileSystem,
    root: str,
    staging: str,
    live: dict[str, DataFile],
    inline_dv_bytes: int = 0,
    read: ReadAhead | None = None,
) -> StagedUpsert:
    """Stage the upsert of ``rows`` (the changed rows) into a table whose files are ``live``; refused
    (:mod:`.checks`) unless it leaves one live row per key. A row deleting its key (``upsert.delete_when``)
    deletes the key's live row as an update does, and adds none.

    Changed rows the driver holds already (:meth:`BucketedUpsert.in_driver`), or up to
    ``upsert.driver_merge_rows`` collected in one Spark job, are written by the driver (pyarrow); more
    are written by the executors (Spark). New DVs up to ``inline_dv_bytes`` go inline into the log, the
    others into one DV file of the checkpoint. ``read``: what was read of live files already (their key columns,
    their DVs: :class:`.lookups.ReadAhead`), the others are read here."""
    import pyarrow as pa

    small = upsert.in_driver(rows)
    adds: list[tuple[str, int | None]] = []
    writing: Future[list[tuple[str, int | None]]] | None = None
    with ThreadPoolExecutor(1, thread_name_prefix="update-file") as writer:
        if small is not None:  # the update file (the rows kept, then written) is made beside the lookups below
            keys = small.select([*upsert.keys, _BUCKET])
            upserted = small.drop_columns([_BUCKET])  # a name no later line rebinds: the thread reads it
            writing = writer.submit(
                lambda: _write_rows(ctx.checkpoint_id, kept_rows(upserted, upsert.delete_when), fs, staging)
            )
        else:
            df = rows.frame().cache()  # read twice: its keys, then its rows
            try:
                flag = [upsert.delete_when] if upsert.delete_when else []
                changed = df.select(*upsert.keys, *flag).withColumn(_BUCKET, upsert.bucket_of()).toArrow()
                keys, count = changed.select([*upsert.keys, _BUCKET]), kept_rows(changed, upsert.delete_when).num_rows
                adds = _write_updates(ctx.checkpoint_id, upsert.kept(df), count, fs, staging) if count else []
            finally:
                df.unpersist()
        ctx.add_metric("sink_rows", keys.num_rows)
        if not keys.num_rows:
            return StagedUpsert(writing.result() if writing is not None else [], [], [])
        fs.makedirs(staging, exist_ok=True)  # a checkpoint of deletes only writes no update file: compactions go there
        affected = set(np.unique(numpy_of(keys[_BUCKET])).tolist())
        candidates = [f for p, f in sorted(live.items()) if bucket_of_path(p) in affected or bucket_of_path(p) is None]
        changed = KeySet(keys.drop_columns([_BUCKET]), upsert.keys)
        key_types = keys.drop_columns([_BUCKET]).schema
        found = Lookup(fs, root, changed, key_types).files(candidates, read or ReadAhead())
        adds = writing.result() if writing is not None else adds
    document = f"Delta table {root}, checkpoint {ctx.checkpoint_id}"
    deleted = pa.concat_tables([f.keys for f in found]) if found else key_types.empty_table()
    delta_checks.check_keys(document, upsert.keys, changed, deleted)
    updates = sorted(p for p in live if bucket_of_path(p) is None)
    merged = updates if len(updates) > MAX_UPDATE_FILES else []
    full = [f for f in found if len(f.deleted) >= COMPACT_FRACTION * f.rows and f.file.path not in merged]
    rewritten = each_file(lambda f: _compact(fs, root, f, f"{staging}/{posixpath.basename(f.file.path)}"), full)
    for f, (_, written) in zip(full, rewritten, strict=True):
        delta_checks.check_rewrite(document, f.file.path, f.rows, len(f.deleted), written)
    removes = [_remove(f.file) for f in full]
    adds += [(out, rows) for out, rows in rewritten if rows]
    if merged:
        hits = {f.file.path: f.deleted for f in found}
        sources = [(live[p], hits[p] if p in hits else deleted_positions(fs, root, live[p])) for p in merged]
        out = f"{staging}/{update_file(ctx.checkpoint_id, len(adds))}"
        written = _merge(fs, root, sources, out, document)
        removes += [_remove(live[p]) for p in merged]
        adds += [(out, written)] if written else []
    partial = [f for f in found if f not in full and f.file.path not in merged]
    deletes = _write_dvs(fs, root, staging, partial, inline_dv_bytes)
    ctx.add_metric("sink_files_deleted_from", len(deletes))
    ctx.add_metric("sink_files_compacted", len(full) + len(merged))
    known = {dv_id(f.file.deletion_vector.to_json()) or "": f.old for f in found if f.file.deletion_vector}
    return StagedUpsert(adds, removes, deletes, known)


def _write_updates(
    checkpoint_id: int, df: DataFrame, rows: int, fs: fsspec.AbstractFileSystem, staging: str
) -> list[tuple[str, int | None]]:
    """The changed rows as update files ``staging/part-u<checkpoint>-<n>.parquet`` (the executors write them)."""
    written = write_parquet(df.coalesce(max(1, math.ceil(rows / UPDATE_FILE_ROWS))), fs, f"{staging}/_changed")
    adds: list[tuple[str, int | None]] = []
    for i, part in enumerate(written):
        named = f"{staging}/{update_file(checkpoint_id, i)}"
        fs.mv(part.path, named)
        adds.append((named, part.rows))
    fs.rm(f"{staging}/_changed", recursive=True)
    return adds


def _write_rows(
    checkpoint_id: int, rows: pa.Table, fs: fsspec.AbstractFileSystem, staging: str
) -> list[tuple[str, int | None]]:
    """The changed rows (collected in the driver) as one update file ``staging/part-u<checkpoint>-0.parquet``."""
    from airflow_provider_checkpoint.connectors.base.bucket_merge import target_schema

    if not rows.num_rows:
        return []
    named = f"{staging}/{update_file(checkpoint_id, 0)}"
    fs.makedirs(staging, exist_ok=True)
    schema = target_schema(rows.schema)
    with table_writer(fs, named, schema) as writer:
        writer.write_table(rows.cast(schema))
    return [(named, rows.num_rows)]


def _compact(fs: fsspec.AbstractFileSystem, root: str, found: Found, out: str) -> tuple[str, int]:
    """Write ``found.file``'s live rows to ``out``, streamed batch by batch; ``(out, rows written)``."""
    with ExitStack() as stack:
        source = stack.enter_context(open_sized(fs, f"{root}/{found.file.path}", found.file.size))
        reader = pq_file(source)
        writer = stack.enter_context(table_writer(fs, out, _rewrite_schema(reader)))
        written = _live_rows(reader, found.deleted, writer)
    if not written:
        fs.rm(out)
    return out, written


def _merge(
    fs: fsspec.AbstractFileSystem, root: str, sources: list[tuple[DataFile, np.ndarray]], out: str, document: str
) -> int:
    """Write the live rows of ``sources`` (each file with every position deleted from it) to ``out`` in order,
    streamed; the rows written. Refused (:mod:`.checks`) unless each file gave exactly its live rows. Files
    written before a column was added (``schema_evolution``) give null in it: ``out`` has every column."""
    schemas = []
    for file, _ in sources:
        with open_sized(fs, f"{root}/{file.path}", file.size) as source:
            schemas.append(_rewrite_schema(pq_file(source)))
    with ExitStack() as stack:
        writer = stack.enter_context(table_writer(fs, out, _union(schemas)))
        written = 0
        for file, deleted in sources:
            with open_sized(fs, f"{root}/{file.path}", file.size) as source:
                reader = pq_file(source)
                kept = _live_rows(reader, deleted, writer)
                delta_checks.check_rewrite(document, file.path, reader.metadata.num_rows, len(deleted), kept)
                written += kept
    if not written:
        fs.rm(out)
    return written


def _live_rows(reader: pq.ParquetFile, deleted: np.ndarray, writer: pq.ParquetWriter) -> int:
    """Append the rows of ``reader`` whose positions ``deleted`` does not hold to ``writer``; how many."""
    import pyarrow as pa

    written, at = 0, 0
    for batch in reader.iter_batches(batch_size=BATCH_ROWS):
        positions = np.arange(at, at + batch.num_rows, dtype=np.uint64)
        rows = pa.Table.from_batches([batch])
        for field in writer.schema:  # a column added to the table after the file was written: null
            if field.name not in rows.column_names:
                rows = rows.append_column(field, pa.nulls(rows.num_rows, field.type))
        kept = rows.select(writer.schema.names).cast(writer.schema).filter(arrow_of(~np.isin(positions, deleted)))
        at += batch.num_rows
        if kept.num_rows:
            writer.write_table(kept)
            written += kept.num_rows
    return written


def _union(schemas: list[pa.Schema]) -> pa.Schema:
    """Every column of ``schemas``, each once, in the order they first appear."""
    import pyarrow as pa

    fields: dict[str, pa.Field] = {}
    for schema in schemas:
        for f in schema:
            fields.setdefault(f.name, f)
    return pa.schema(list(fields.values()))


def _rewrite_schema(reader: pq.ParquetFile) -> pa.Schema:
    """The schema a compacted file is written with: its own, every column nullable, and Spark's INT96
    timestamps (UTC instants) as UTC timestamps, as the table's ``timestamp`` type means."""
    import pyarrow as pa

    int96 = {c.path for c in reader.schema if c.physical_type == "INT96"}
    return pa.schema(
        [
            (f.with_type(pa.timestamp("us", "UTC")) if f.name in int96 else f).with_nullable(True)
            for f in reader.schema_arrow
        ]
    )


def _remove(file: DataFile) -> DeltaFile:
    return DeltaFile(file.path, file.size or 0, deletion_vector=file.deletion_vector)


def _write_dvs(
    fs: fsspec.AbstractFileSystem, root: str, staging: str, found: list[Found], inline_dv_bytes: int
) -> list[DeltaDeletes]:
    """The new DV of every file in ``found``: inline in the log up to ``inline_dv_bytes``, the larger ones
    in one DV file under ``staging``."""
    descriptors = [deletion_vectors.inline(f.deleted) for f in found]
    large = [i for i, d in enumerate(descriptors) if d.size > inline_dv_bytes]
    if large:
        stored, path = deletion_vectors.new_descriptor_path(staging[len(root) + 1 :])
        written = deletion_vectors.write_file(fs, f"{root}/{path}", stored, [found[i].deleted for i in large])
        for i, dv in zip(large, written, strict=True):
            descriptors[i] = dv
    return [
        DeltaDeletes(f.file.path, f.file.size or 0, f.rows, f.file.deletion_vector, dv)
        for f, dv in zip(found, descriptors, strict=True)
    ]
