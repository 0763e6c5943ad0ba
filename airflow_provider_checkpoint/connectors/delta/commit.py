"""The Delta commit of a checkpoint, an append's (adds only) and an upsert's, written by us with our own
log replay (no delta-rs open before it). delta-rs's transaction API (``create_write_transaction`` with
``CommitProperties(app_transactions=...)``) carries no deletion vector in its ``AddAction``/``RemoveAction``,
so it cannot commit an upsert; for an append it opens the table first, re-reading the log on an object store
(locally it is faster: an append + log checkpoint took it 0.23 s, ours 0.63 s at 1,000 live files, 0.026 s
vs 0.043 s at 50; load 40 on 2 cores, ``scripts/bench/delta_library.py``).

One commit file ``_delta_log/<version>.json`` created exclusively (a hard link locally, a
conditional PUT on object stores): ``commitInfo``, ``txn(app id, checkpoint id)``, the
removes, per file with new deletes a ``remove`` (with its old DV) and an ``add`` of the
same path with the new DV, and the adds; checked before it is created against the Delta
protocol and the sink's invariants (:mod:`.checks`). Another writer's commit in between
is a conflict if it touched a file this commit removes or deletes from (Delta's rule for
deletes) or changed the table's metadata or protocol; one holding this checkpoint's ``txn``
means another attempt committed it; otherwise the commit is retried on top of it. Every
:data:`CHECKPOINT_INTERVAL` versions a log checkpoint is written from the commit's own log
replay (:mod:`.log_checkpoint`; delta-rs's ``create_checkpoint`` for a table using what that does
not write): the log replay of each stage and commit
(:func:`~airflow_provider_checkpoint.connectors.delta.log.snapshot`) reads fewer than that many
commits after it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_provider_checkpoint.connectors.delta import checks as delta_checks
from airflow_provider_checkpoint.connectors.delta import deletion_vectors, evolution
from airflow_provider_checkpoint.connectors.delta import log as delta_log
from airflow_provider_checkpoint.connectors.delta import log_checkpoint as log_checkpoint_writer
from airflow_provider_checkpoint.connectors.delta.files import DeltaCommit
from airflow_provider_checkpoint.connectors.delta.log_checkpoint import Replay
from airflow_provider_checkpoint.connectors.delta.log_checks import listing, read, remember
from airflow_provider_checkpoint.core.documents import Fields, load_json
from airflow_provider_checkpoint.exceptions import CheckpointStorageError, DocumentError
from airflow_provider_checkpoint.storage.writes import create_exclusive

if TYPE_CHECKING:
    import fsspec
    import numpy as np
    from deltalake import DeltaTable

log = logging.getLogger(__name__)

RETRIES = 20
CONFLICT_SCAN = 100
"""How many commits back a conflict's refusal looks for the other writers' commits it names."""
CHECKPOINT_INTERVAL = 1
"""A log checkpoint after every commit: each open of the table (three tasks per checkpoint) then reads
``_last_checkpoint``, the checkpoint and no commit; measured on S3, fewer requests per checkpoint of the
job than every 10 commits (delta-rs reads each commit after a checkpoint twice per open), and flat."""


class Committed(NamedTuple):
    """A commit this writer made: its version, its ``commitInfo`` timestamp (ms since the epoch) and the
    table's state at that version (the log replay of the version before it, the commit applied)."""

    version: int
    timestamp: int
    state: Replay


def commit(
    fs: fsspec.AbstractFileSystem,
    root: str,
    table: str,
    app_id: str,
    checkpoint_id: int,
    changes: DeltaCommit,
    document: str,
    since: int,
    partition_by: list[str] | None = None,
    listed: dict[str, int | None] | None = None,
) -> Committed | None:
    """Commit ``changes`` with ``txn(app_id, checkpoint_id)``: an upsert's ``MERGE``, or with ``partition_by``
        an append's ``WRITE``. ``since``: the version whose log said the checkpoint was not committed; ``None``
        if a commit after it holds the checkpoint's ``txn`` (another attempt committed it meanwhile), a
        :class:`CheckpointStorageError` if one changed the table's metadata or protocol (a conflict, as Delta
        has it: the next attempt of the task checks the input against the new metadata). ``listed``: the log's
    files as just listed (at ``since``), for the first attempt (a version taken since is a conflict, then
    listed again)."""
    file_actions = _actions(app_id, checkpoint_id, changes, partition_by)
    dv_files: dict[str, bytes] = {}  # each DV file read once by the checks
    for _ in range(RETRIES):
        files, latest, state = _latest(fs, root, table, listed)
        grown = evolution.grown_metadata(table, state.metadata, changes.columns)
        actions = file_actions if grown is None else [*file_actions[:2], {"metaData": grown}, *file_actions[2:]]
        live = state.adds
        listed = None
        if _committed_since(fs, root, table, files, since, latest, app_id, checkpoint_id):
            return None
        since = latest
        _check(fs, root, table, files, latest, live, changes, document)
        version = latest + 1
        _check_version(
            fs, root, f"Delta table {table}, version {version} (checkpoint {checkpoint_id})", actions, live, dv_files
        )
        body = "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions).encode()
        if create_exclusive(fs, f"{root}/{delta_log.LOG_DIR}/{version:020d}.json", body):
            remember(fs, root, table, f"{version:020d}.json", body)  # the log check after it reads it not
            state.apply(version, actions)
            return Committed(version, actions[0]["commitInfo"]["timestamp"], state)
        log.info("Delta table %s: version %d was taken by another writer, retrying on top of it", table, version)
    raise CheckpointStorageError(f"Delta table {table}: no commit version free after {RETRIES} attempts")


def _latest(
    fs: fsspec.AbstractFileSystem, root: str, table: str, listed: dict[str, int | None] | None = None
) -> tuple[dict[str, int | None], int, Replay]:
    """The log's files and sizes, the table's latest version and its state (its live files, as
    :func:`.log.live_actions` has them): one listing of the log (none if ``listed``)."""
    files = listing(fs, root) if listed is None else listed
    latest = delta_log.commit_versions(fs, root, files)[-1]
    return files, latest, log_checkpoint_writer.replay(fs, root, table, latest, files)


def _committed_since(
    fs: fsspec.AbstractFileSystem,
    root: str,
    table: str,
    files: dict[str, int | None],
    since: int,
    latest: int,
    app_id: str,
    checkpoint_id: int,
) -> bool:
    """Whether a commit after ``since`` (up to ``latest``, as ``files`` lists the log) holds
    ``txn(app_id, checkpoint_id or later)``; a :class:`CheckpointStorageError` for one with a ``metaData``
    or ``protocol`` action (Delta's conflict rule). Reads only the other writers' commits."""
    for v in range(since + 1, latest + 1):
        for action in _commit_actions(fs, root, table, files, v):
            txn = action.get("txn")
            if isinstance(txn, dict) and txn.get("appId") == app_id:
                found = txn.get("version")
                if type(found) is int and found >= checkpoint_id:
                    return True
            if "metaData" in action or "protocol" in action:
                raise CheckpointStorageError(
                    f"Delta table {table}: version {v}, committed by another writer since version {since}, "
                    "changes the table's metadata or protocol: a conflict, nothing committed (a retry of the "
                    "task commits on top of it)"
                )
    return False


def _commit_actions(
    fs: fsspec.AbstractFileSystem, root: str, table: str, files: dict[str, int | None], version: int
) -> list[dict[str, Any]]:
    """The actions of commit ``version`` as ``files`` lists the log (none if it is not listed: log
    retention removed it), each line a JSON object or skipped."""
    name = f"{version:020d}.json"
    if name not in files:
        return []
    document = f"{table}/{delta_log.LOG_DIR}/{name}"
    lines = read(fs, f"{root}/{delta_log.LOG_DIR}/{name}", files[name]).splitlines()
    actions = [load_json(line, document) if line.strip() else None for line in lines]
    return [a for a in actions if isinstance(a, dict)]


def _operation(actions: list[dict[str, Any]]) -> str:
    """The ``commitInfo`` operation of a commit, printable (``unknown operation`` without one)."""
    for action in actions:
        info = action.get("commitInfo")
        if isinstance(info, dict) and isinstance(info.get("operation"), str):
            return "".join(c for c in info["operation"][:40] if c.isalnum() or c in " _-")
    return "unknown operation"


def _removed_by(
    fs: fsspec.AbstractFileSystem, root: str, table: str, files: dict[str, int | None], latest: int, paths: set[str]
) -> list[tuple[int, str]]:
    """The commits, newest first from ``latest``, that removed one of ``paths`` (a rewrite, or a remove
    and re-add with another deletion vector): ``(version, operation)``, found by reading the log back
    until every path is accounted for (at most :data:`CONFLICT_SCAN` commits)."""
    from urllib.parse import unquote

    found: list[tuple[int, str]] = []
    left = set(paths)
    for v in range(latest, max(latest - CONFLICT_SCAN, -1), -1):
        actions = _commit_actions(fs, root, table, files, v)
        removed = {
            unquote(r["path"])
            for a in actions
            if isinstance(r := a.get("remove"), dict) and isinstance(r.get("path"), str)
        }
        if removed & left:
            found.append((v, _operation(actions)))
            left -= removed
        if not left:
            break
    return found


def _check(
    fs: fsspec.AbstractFileSystem,
    root: str,
    table: str,
    files: dict[str, int | None],
    latest: int,
    live: dict[tuple[str, str | None], delta_log.RawFile],
    changes: DeltaCommit,
    document: str,
) -> None:
    """Every file removed or deleted from is live in the table with the DV the step saw (identities
    compared only: the live actions need no validation here). Else a conflict, as Delta's rules have it
    (a commit that removed a file, even without a data change as ``OPTIMIZE``, or deleted rows from it,
    conflicts with a later one deleting from it): refused naming the other writers' commits that did it
    and the ways on."""
    seen = [(r.path, r.deletion_vector) for r in changes.removes] + [(d.path, d.old) for d in changes.deletes]
    stale = [path for path, dv in seen if (path, delta_log.dv_id(dv.to_json() if dv else None)) not in live]
    if stale:
        by = _removed_by(fs, root, table, files, latest, set(stale))
        named = ", ".join(f"{v} ({operation})" for v, operation in reversed(by))
        which = f"versions {named}" if by else f"not found in the last {CONFLICT_SCAN} versions"
        undo = (
            f"delta-spark's RESTORE TABLE ... TO VERSION AS OF {by[-1][0] - 1}, which also undoes every version "
            "after it"
            if by
            else "delta-spark's RESTORE TABLE ... TO VERSION AS OF the version before it"
        )
        raise DocumentError(
            document,
            "removes",
            f"name files the table does not hold as staged: another writer's commit ({which}) "
            f"removed them or deleted rows from them — a conflict, nothing committed. Undo it (e.g. {undo}) and "
            "the finalize's next attempt commits the checkpoint, or restore the job to its previous checkpoint "
            "(docs/delta-lake.md, 'Another writer in an upsert table')",
            stale[:5],
        )


def check_staged(
    fs: fsspec.AbstractFileSystem,
    root: str,
    table: str,
    checkpoint_id: int,
    changes: DeltaCommit,
    seen: delta_log.Snapshot | None = None,
    known: Mapping[str, np.ndarray] | None = None,
) -> None:
    """The checks of :func:`commit` in the step, on the staged changes and the table's latest version: a
    version the writer gets wrong is refused before the checkpoint completes (its step fails, the
    checkpoint is aborted), not only when its commit is about to be written. ``seen``: the snapshot the step
    staged on, its live files used while the log's latest version is still its version (the log listed once:
    a commit since, another writer's too, is replayed and checked against); ``known``: the positions of the
    table's DVs the step decoded, by DV id (a DV file is never rewritten), the staged DVs decoded from their
    files."""
    listed = listing(fs, root)
    if seen is not None and delta_log.commit_versions(fs, root, listed)[-1:] == [seen.version]:
        latest, live = seen.version, seen.actions
    else:
        _, latest, state = _latest(fs, root, table, listed)
        live = state.adds
    where = f"Delta table {table}, staged on version {latest} (checkpoint {checkpoint_id})"
    _check_version(fs, root, where, _actions("staged", checkpoint_id, changes), live, {}, known or {})


def _check_version(
    fs: fsspec.AbstractFileSystem,
    root: str,
    where: str,
    actions: list[dict[str, Any]],
    live: dict[tuple[str, str | None], delta_log.RawFile],
    dv_files: dict[str, bytes],
    known: Mapping[str, np.ndarray] | None = None,
) -> None:
    """:func:`.checks.check_version` with the DVs the actions name decoded from the table
    (``dv_files``: each DV file read once, kept across calls; ``known``: positions already decoded, by DV id)."""

    def positions(dv: Mapping[str, Any], name: str) -> np.ndarray:
        found = known.get(delta_log.dv_id(dv) or "") if known else None
        if found is not None:
            return found
        descriptor = deletion_vectors.read_descriptor(Fields(dv, name))
        return deletion_vectors.read_positions(fs, root, descriptor, name, dv_files)

    delta_checks.check_version(where, actions, live, positions)


def _actions(
    app_id: str, checkpoint_id: int, changes: DeltaCommit, partition_by: list[str] | None = None
) -> list[dict[str, Any]]:
    """The actions of the commit, one line each in ``_delta_log/<version>.json`` (``partition_by``: an
    append's, as delta-rs writes it)."""
    now = int(time.time() * 1000)
    if partition_by is None:
        operation: dict[str, Any] = {"operation": "MERGE", "operationParameters": {"predicate": "upsert by keys"}}
    else:
        parameters = {"mode": "Append", "partitionBy": json.dumps(partition_by)}
        operation = {"operation": "WRITE", "operationParameters": parameters, "isBlindAppend": True}
    info = {"timestamp": now, **operation, "checkpoint_app_id": app_id, "checkpoint_id": checkpoint_id}
    actions: list[dict[str, Any]] = [
        {"commitInfo": {**info, "engineInfo": "airflow-provider-checkpoint"}},
        {"txn": {"appId": app_id, "version": checkpoint_id, "lastUpdated": now}},
    ]
    for r in changes.removes:
        actions.append({"remove": _file(r.path, r.size, now, r.deletion_vector, remove=True)})
    for d in changes.deletes:
        actions.append({"remove": _file(d.path, d.size, now, d.old, remove=True)})
        actions.append({"add": {**_file(d.path, d.size, now, d.new), "stats": _stats(d.num_records)}})
    for a in changes.adds:
        add = {**_file(a.path, a.size, now, None), "partitionValues": dict(a.partition_values)}
        actions.append({"add": {**add, "stats": _stats(a.num_records)}})
    return actions


def _file(path: str, size: int, now: int, dv: Any, remove: bool = False) -> dict[str, Any]:
    from urllib.parse import quote

    out: dict[str, Any] = {"path": quote(path, safe="/="), "partitionValues": {}, "size": size, "dataChange": True}
    out["deletionTimestamp" if remove else "modificationTime"] = now
    if remove:
        out["extendedFileMetadata"] = True
    return {**out, "deletionVector": dv.to_json()} if dv is not None else out


def _stats(records: int) -> str:
    return json.dumps({"numRecords": records})


def log_checkpoint(
    fs: fsspec.AbstractFileSystem, root: str, table: str, done: Committed, opened: Callable[[], DeltaTable]
) -> None:
    """A log checkpoint of the version ``done`` committed when it is a multiple of :data:`CHECKPOINT_INTERVAL`:
    written from the commit's log replay (:mod:`.log_checkpoint`), or by delta-rs opened at that version or
    later (``opened()``) for a table whose checkpoint this writer does not reproduce."""
    if done.version % CHECKPOINT_INTERVAL != 0:
        return
    if not log_checkpoint_writer.write(fs, root, done.state):
        log.info(
            "Delta table %s: log checkpoint of version %d by delta-rs (%s)",
            table,
            done.version,
            log_checkpoint_writer.why_not(done.state),
        )
        opened().create_checkpoint()
