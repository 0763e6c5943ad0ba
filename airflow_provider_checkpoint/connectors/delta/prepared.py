"""A Delta upsert sink's stage prepared on a thread while the step reads its input (a CDC source's peek waits on
PostgreSQL, the GIL free): the table's log checked, its live files listed, the key columns the lookups will read
read, as the stage would first do itself a moment later. Nothing is written.

The stage of the same step attempt takes them (:func:`take`) once, if the log's latest version is still the one
prepared: what it stages is then what it would have staged on its own reads (the same version, the same
immutable files). A preparation that failed, or that a commit (another writer's) has made stale, is dropped: the
stage reads everything itself, as without one, and raises its own errors. The key columns are read ahead only
for a table of at most :data:`PREPARED_KEY_ROWS` live rows (memory: those columns)."""

from __future__ import annotations

import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.connectors.base.file_threads import each_file
from airflow_provider_checkpoint.connectors.delta.opened import OpenedTable

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_provider_checkpoint.connectors.delta import log as delta_log
    from airflow_provider_checkpoint.dataflow.context import StepContext

PREPARED_KEY_ROWS = 4_000_000
"""Live rows of a table whose key columns are read ahead at most."""


@dataclass
class Prepared:
    """What the stage takes: the call's table (log checked), the latest snapshot and the key columns of its
    live files (by path: the file's batches, as the lookups read them)."""

    table: OpenedTable
    snapshot: delta_log.Snapshot | None
    keys: dict[str, list[pa.Table]] = field(default_factory=dict)


_PREPARING: weakref.WeakKeyDictionary[Any, tuple[str, Future[Prepared]]] = weakref.WeakKeyDictionary()
"""By sink (gone with it): the step attempt (checkpoint and attempt tag) prepared for, and its preparation."""


def _tag(ctx: StepContext) -> str:
    return f"{ctx.checkpoint_id}/{ctx.attempt_tag}"


def start(sink: Any, ctx: StepContext, read_keys: Any, key_names: list[str]) -> None:
    """Prepare ``sink``'s stage of ``ctx``'s attempt on a thread: ``read_keys(fs, root, file, names)`` gives a
    live file's key column batches."""
    fs, root = sink._fs()
    opened = OpenedTable(fs, root, sink.asset_uri(), sink.delta_options())

    def prepare() -> Prepared:
        if opened.state() is None:
            return Prepared(opened, None)
        snapshot = sink._snapshot()
        live = list(snapshot.files.values())
        if sum(f.num_records or 0 for f in live) > PREPARED_KEY_ROWS or any(f.num_records is None for f in live):
            return Prepared(opened, snapshot)
        keys = each_file(lambda f: read_keys(fs, root, f, key_names), live)
        return Prepared(opened, snapshot, {f.path: k for f, k in zip(live, keys, strict=True)})

    pool = ThreadPoolExecutor(1, thread_name_prefix="delta-prepare")
    try:
        _PREPARING[sink] = (_tag(ctx), pool.submit(prepare))
    finally:
        pool.shutdown(wait=False)


def take(sink: Any, ctx: StepContext) -> Prepared | None:
    """The preparation of ``sink``'s stage of ``ctx``'s attempt, once it is done, while its snapshot is still the
    table's latest version (one listing of the log); ``None`` if there is none, it failed, the table had no version
    or has a newer one (the stage reads for itself, as without a preparation)."""
    from airflow_provider_checkpoint.connectors.delta import log as delta_log

    tag, future = _PREPARING.pop(sink, ("", None))
    if future is None or tag != _tag(ctx):
        return None
    try:
        prepared = future.result()
    except Exception:  # the stage's own reads raise it again, or pass
        return None
    fs, root = prepared.table.fs, prepared.table.root
    if prepared.snapshot is None or delta_log.commit_versions(fs, root)[-1:] != [prepared.snapshot.version]:
        return None
    return prepared
