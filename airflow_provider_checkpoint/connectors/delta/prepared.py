"""A Delta upsert sink's stage prepared on a thread while the step reads its input (a CDC source's peek waits on
PostgreSQL, the GIL free). Nothing is written.

What is prepared is what every upsert stage reads first: the table's log checked (:meth:`.OpenedTable.state`) and
its latest snapshot (the live files, their links checked). The key columns of the live files, and the positions
their DVs delete, are read ahead for a table on local storage of at most :data:`PREPARED_KEY_ROWS` live rows. Which
files the stage looks up (the bucket files of the changed keys' buckets, and the update files) is known only once
the input is read; read ahead, the others are read for nothing. On local storage that costs a thread's bounded
reading beside the input's; on an object store it costs requests and bytes (all the bucket files where the stage may
read one), so there the stage reads the files it looks up itself, and a preparation reads no data file.

The stage of the same step attempt takes the preparation (:func:`take`) once, if the log's latest version is
still the one prepared: what it stages is then what it would have staged on its own reads (the same version, the
same immutable files). A preparation that failed, or that a commit (another writer's) has made stale, is
dropped: the stage reads everything itself, as without one, and raises its own errors.

The preparation runs on a daemon thread (an interpreter exiting does not wait for it: it only reads), reads one
file at a time, and stops between files once it is dropped: replaced by the sink's next preparation, or found of
another attempt by the stage. One no stage takes and none replaces (the step failed before its stage) runs to its
end, bounded: local files, at most :data:`PREPARED_KEY_ROWS` rows of key columns."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.connectors.delta import log as delta_log
from airflow_provider_checkpoint.connectors.delta.lookups import ReadAhead, deleted_positions, read_keys
from airflow_provider_checkpoint.connectors.delta.opened import OpenedTable, Prepared
from airflow_provider_checkpoint.storage.paths import is_local

if TYPE_CHECKING:
    from airflow_provider_checkpoint.connectors.delta.log import Snapshot
    from airflow_provider_checkpoint.dataflow.context import StepContext

PREPARED_KEY_ROWS = 1_000_000
"""Live rows of a table whose key columns are read ahead at most (memory: those columns; time: a thread's
reading them, when the stage looks up only some of the files)."""


@dataclass
class _Preparation:
    tag: str
    table: OpenedTable
    done: Future[Prepared | None]
    stop: threading.Event


_PREPARING: weakref.WeakKeyDictionary[object, _Preparation] = weakref.WeakKeyDictionary()
"""By sink (gone with it): the preparation of its next stage."""


def _tag(ctx: StepContext) -> str:
    return f"{ctx.checkpoint_id}/{ctx.attempt_tag}"


def start(
    sink: object,
    ctx: StepContext,
    table: OpenedTable,
    snapshot: Callable[[], Snapshot],
    key_names: list[str],
) -> None:
    """Prepare ``sink``'s stage of ``ctx``'s attempt on a thread, in ``table`` (the call the stage will run in):
    its log checked, ``snapshot()`` (the latest), and on local storage the columns ``key_names`` of every live
    file of a small table (:data:`PREPARED_KEY_ROWS`). An earlier preparation of ``sink`` is dropped."""
    ahead = is_local(table.fs)
    stop = threading.Event()
    done: Future[Prepared | None] = Future()

    def prepare() -> Prepared | None:
        if table.state() is None:
            return None
        latest = snapshot()
        live = list(latest.files.values())
        rows = [f.num_records for f in live]
        if not ahead or None in rows or sum(r or 0 for r in rows) > PREPARED_KEY_ROWS:
            return Prepared(latest)
        read = ReadAhead()
        for f in live:
            if stop.is_set():
                return Prepared(latest, read)
            read.keys[f.path] = read_keys(table.fs, table.root, f, key_names)
            read.deleted[f.path] = deleted_positions(table.fs, table.root, f)
        return Prepared(latest, read)

    def run() -> None:
        try:
            done.set_result(prepare())
        except BaseException as e:  # the stage's own reads raise it again, or pass
            done.set_exception(e)

    _drop(_PREPARING.pop(sink, None))
    _PREPARING[sink] = _Preparation(_tag(ctx), table, done, stop)
    threading.Thread(target=run, name="delta-prepare", daemon=True).start()


def _drop(preparation: _Preparation | None) -> None:
    if preparation is not None:
        preparation.stop.set()


def take(sink: object, ctx: StepContext) -> OpenedTable | None:
    """The table the preparation of ``sink``'s stage of ``ctx``'s attempt opened, what it read in its
    :attr:`~.OpenedTable.prepared`, once it is done, while its snapshot is still the table's latest version (one
    listing of the log); ``None`` if there is none, it failed, the table had no version or has a newer one (the
    stage reads for itself, as without a preparation). A preparation of another attempt is dropped."""
    preparation = _PREPARING.pop(sink, None)
    if preparation is None or preparation.tag != _tag(ctx):
        _drop(preparation)
        return None
    try:
        prepared = preparation.done.result()
    except Exception:  # the stage's own reads raise it again, or pass
        return None
    table = preparation.table
    if prepared is None or delta_log.commit_versions(table.fs, table.root)[-1:] != [prepared.snapshot.version]:
        return None
    table.prepared = prepared
    return table
