"""Snapshots outside the protocol's hot path: savepoints, restore validation, reading state.

A savepoint is a self-contained copy of a completed checkpoint in canonical format:
``_metadata`` (JSON) plus plain Parquet state files under ``state/<uid>/``, referenced
by paths relative to the savepoint directory, so the directory can be moved or copied
and still be restored, and read with pyarrow, pandas, DuckDB or Spark alone.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import re
import shutil
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.arrow_state import check_file, range_tables, read_inline, read_table
from airflow_provider_checkpoint.core import metadata
from airflow_provider_checkpoint.core.documents import MAX_ID
from airflow_provider_checkpoint.core.model import (
    CheckpointType,
    CompletedCheckpoint,
    OperatorSnapshot,
    RestorePoint,
    RestoreRequest,
    StateHandle,
)
from airflow_provider_checkpoint.dataflow.sinks import FORMAT as TABLE_FORMAT
from airflow_provider_checkpoint.dataflow.sinks import check_table_committables
from airflow_provider_checkpoint.exceptions import RefusedInputError
from airflow_provider_checkpoint.storage import CheckpointStorageError, JobStorage, Location
from airflow_provider_checkpoint.storage.job_storage import METADATA, inline_parquet
from airflow_provider_checkpoint.storage.paths import UnsafePathError, is_local, resolve_under_roots, within

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession


_ID = re.compile(r"^[0-9]+$")
_CHK_DIR = re.compile(r"^chk-\d+$")


class RestoreError(RefusedInputError):
    """A snapshot cannot be restored into this job; the message lists every reason."""


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A completed checkpoint or savepoint found at ``location``; handles resolve under ``base``."""

    checkpoint: CompletedCheckpoint
    location: Location
    base: Location

    def restore_point(self) -> RestorePoint:
        return self.checkpoint.to_restore_point(self.location.url(), self.base.url())

    def verify(self) -> None:
        """Every state file present with its recorded size and checksum (errors name the file)."""
        for uid, snapshot in sorted(self.checkpoint.operators.items()):
            verify_state(self.base, uid, snapshot)


def verify_state(base: Location, uid: str, state: OperatorSnapshot, new_in: str | None = None) -> None:
    """The state files, or the inline state, of operator ``uid`` are intact.

    Without ``new_in`` (a snapshot to restore or read), each also holds the recorded
    columns (:class:`~airflow_provider_checkpoint.arrow_state.StateFileError` otherwise).
    With ``new_in`` (a directory; finalize), files outside it — kept from older
    checkpoints, each hashed when it was written — are checked by size only.
    """
    if state.inline is not None and new_in is None:
        read_inline(state, uid)
    elif state.inline is not None:
        inline_parquet(state, uid)
    for handle in state.handles:
        base.verify(handle, deep=new_in is None or handle.path.startswith(new_in + "/"))
        if new_in is None:
            check_file(base, handle, state, uid)


def open_snapshot(pointer: str, **storage_options: Any) -> Snapshot:
    """The snapshot at ``pointer``: a checkpoint or savepoint directory, or its ``_metadata``."""
    directory = pointer.rstrip("/")
    if directory.endswith("/" + METADATA):
        directory = directory[: -len(METADATA) - 1]
    location = Location.from_url(directory, **storage_options)
    if not location.exists(METADATA):
        raise CheckpointStorageError(
            f"no checkpoint or savepoint at {location.url()}: {location.url(METADATA)} does not exist"
        )
    checkpoint = location.load_snapshot()
    if checkpoint.relocatable:
        return Snapshot(checkpoint, location, location)
    job_dir = posixpath.dirname(location.base)
    if (posixpath.basename(location.base), posixpath.basename(job_dir)) != (
        JobStorage.chk_dir(checkpoint.checkpoint_id),
        checkpoint.job_id,
    ):
        raise RestoreError(
            f"{location.url(METADATA)} is checkpoint {checkpoint.checkpoint_id} of job {checkpoint.job_id!r} "
            f"(not a relocatable savepoint), so it must lie in its job directory as "
            f"{checkpoint.job_id}/{JobStorage.chk_dir(checkpoint.checkpoint_id)}/; take a savepoint to move "
            "state elsewhere"
        )
    return Snapshot(checkpoint, location, Location(location.fs, posixpath.dirname(location.base)))


def check_compatible(
    snapshot: Snapshot,
    job_id: str,
    stateful_keys: Mapping[str, Sequence[str]],
    allow_non_restored_state: bool,
) -> list[str]:
    """Validate ``snapshot`` against the job's stateful operators (uid → key columns).

    Returns the uids that start with empty state; raises :class:`RestoreError` when the
    snapshot belongs to another job, keys changed, or it holds state for an operator the
    pipeline no longer has (unless ``allow_non_restored_state``).
    """
    cp = snapshot.checkpoint
    problems = []
    if cp.job_id != job_id:
        problems.append(f"the snapshot belongs to job {cp.job_id!r}, not {job_id!r}")
    for uid, state in sorted(cp.operators.items()):
        if uid not in stateful_keys:
            if not allow_non_restored_state:
                problems.append(
                    f"it holds state for operator {uid!r}, which the pipeline no longer has "
                    "(set allow_non_restored_state to drop that state)"
                )
        elif tuple(stateful_keys[uid]) != state.keys:
            problems.append(
                f"operator {uid!r} is keyed by {list(stateful_keys[uid])} but its state by {list(state.keys)}"
            )
    if problems:
        raise RestoreError(f"cannot restore {snapshot.location.url()}: " + "; ".join(problems))
    return sorted(set(stateful_keys) - set(cp.operators))


def check_savepoint_target(target: Location, storage_root: str, own: CompletedCheckpoint | None = None) -> None:
    """Refuse (:class:`UnsafePathError`) a savepoint directory that is not fresh or lies in a checkpoint tree.

    A savepoint is written only to a directory that does not exist yet or is empty, and
    that belongs to no job's checkpoint tree: not inside ``<storage_root>/<job>/``, not
    named or under a ``chk-<n>`` directory, under no directory holding a ``_job.json``. On
    local filesystems the target's real location (after links) is checked. ``own``: the
    checkpoint whose savepoint an earlier, interrupted finalize may have started there.
    """
    fs, local = target.fs, is_local(target.fs)
    real = os.path.realpath(target.base) if local else target.base
    root = (os.path.realpath(storage_root) if local else storage_root).rstrip("/")
    refused = f"refusing savepoint target {target.url()}" + (f" (it resolves to {real})" if real != target.base else "")
    if within(real, root) and real.count("/") - root.count("/") != 1:
        raise UnsafePathError(f"{refused}: it lies in a job's checkpoint tree {root}/<job>/")
    ancestor = real
    while ancestor not in ("", "/"):
        if _CHK_DIR.match(posixpath.basename(ancestor)) or fs.exists(f"{ancestor}/_job.json"):
            raise UnsafePathError(
                f"{refused}: {ancestor} is part of a job's checkpoint tree (a chk-<n> or job directory)"
            )
        ancestor = posixpath.dirname(ancestor)
    if not fs.exists(real):
        return
    entries = {posixpath.basename(e.rstrip("/")) for e in fs.ls(real, detail=False)} if fs.isdir(real) else {""}
    if own is not None and entries <= {"state", METADATA} | {e for e in entries if e.startswith(".")}:
        if METADATA not in entries:
            return  # the state files an interrupted finalize of ``own`` copied
        written = Location(fs, real).load_snapshot()
        if (written.job_id, written.checkpoint_id, written.relocatable) == (own.job_id, own.checkpoint_id, True):
            return
    if entries:
        raise UnsafePathError(f"{refused}: it exists and is not empty; a savepoint target must be new or empty")


def write_savepoint(source: Location, checkpoint: CompletedCheckpoint, target: Location) -> CompletedCheckpoint:
    """Copy ``checkpoint`` (handles relative to ``source``) into a savepoint at ``target``.

    Idempotent; ``_metadata`` is written last, so a directory without it is incomplete.
    Every copied file is verified against the original checksum.
    """
    if target.exists(METADATA):
        return target.load_snapshot()
    for uid, state in sorted(checkpoint.operators.items()):  # every file's columns, before anything is written
        for handle in state.handles:
            check_file(source, handle, state, uid)
    operators: dict[str, OperatorSnapshot] = {}
    for uid, state in sorted(checkpoint.operators.items()):
        handles = []
        if state.inline is not None:  # canonical form: the inline state becomes a file for all key groups
            data = inline_parquet(state, uid)
            relative = f"state/{uid}/kg-00000-{state.max_parallelism - 1:05d}-0000.parquet"
            target.write_atomic(relative, data)
            handles.append(target.handle_for(relative, (0, state.max_parallelism - 1)))
        elif any(h.delta is not None for h in state.handles):  # canonical form: deltas merged, a file per range
            handles = _write_merged(source, state, target, uid)
            state = dataclasses.replace(state, handles=())
        for n, handle in enumerate(state.handles):
            lo, hi = handle.key_groups or (0, 0)
            relative = f"state/{uid}/kg-{lo:05d}-{hi:05d}-{n:04d}.parquet"
            target.fs.makedirs(posixpath.dirname(target.path(relative)), exist_ok=True)
            with (
                source.fs.open(source.path(handle.path), "rb") as src,
                target.fs.open(target.path(relative), "wb") as dst,
            ):
                shutil.copyfileobj(src, dst, 1 << 20)
            copied = target.handle_for(relative, handle.key_groups)
            if (copied.size, copied.checksum) != (handle.size, handle.checksum):
                raise CheckpointStorageError(f"savepoint copy of {source.url(handle.path)} does not match its checksum")
            handles.append(copied)
        operators[uid] = dataclasses.replace(
            state, handles=tuple(handles), inline=None, rows=checkpoint.operators[uid].rows
        )
    savepoint = dataclasses.replace(
        checkpoint,
        type=CheckpointType.SAVEPOINT,
        operators=operators,
        relocatable=True,
        options={},
    )
    target.write_atomic(METADATA, metadata.encode(savepoint))
    return savepoint


def read_state(pointer: str, operator_uid: str, spark: SparkSession | None = None) -> pa.Table | DataFrame:
    """The keyed state of ``operator_uid`` in a checkpoint or savepoint, after checksum verification.

    ``pointer`` is a checkpoint or savepoint directory, or its ``_metadata``. Returns a
    pyarrow Table, or a Spark DataFrame when ``spark`` is given.
    """
    snapshot = open_snapshot(pointer)
    state = snapshot.checkpoint.operators.get(operator_uid)
    if state is None:
        known = ", ".join(sorted(snapshot.checkpoint.operators)) or "none"
        raise KeyError(f"{snapshot.location.url()} has no state for operator {operator_uid!r} (it has: {known})")
    verify_state(snapshot.base, operator_uid, state)
    if spark is not None:
        from airflow_provider_checkpoint.spark.state import read_state as read_spark_state

        return read_spark_state(spark, snapshot.base, state, uid=operator_uid)
    return read_table(snapshot.base, state, operator_uid)


def _write_merged(source: Location, state: OperatorSnapshot, target: Location, uid: str) -> list[StateHandle]:
    import io

    import pyarrow.parquet as pq

    handles = []
    for (lo, hi), table in range_tables(source, state, uid):
        if not len(table):
            continue
        buffer = io.BytesIO()
        pq.write_table(table, buffer, compression="zstd")
        relative = f"state/{uid}/kg-{lo:05d}-{hi:05d}-0000.parquet"
        target.write_atomic(relative, buffer.getvalue())
        handles.append(target.handle_for(relative, (lo, hi)))
    return handles


def resolve_pointer(storage: JobStorage, checkpoint: str, roots: Sequence[str]) -> str:
    """The URL of the snapshot named by a restore DAG's ``checkpoint`` param.

    ``latest`` (the newest completed checkpoint of the job), a checkpoint id, or a path
    to a checkpoint or savepoint directory (or its ``_metadata``) under ``roots``.
    """
    value = str(checkpoint)
    if value.strip() in ("", "latest"):
        ids = storage.completed_ids()
        if not ids:
            raise CheckpointStorageError(f"job {storage.job_id} has no completed checkpoint in {storage.url()}")
        return storage.url(storage.chk_dir(ids[-1]))
    if _ID.match(value.strip()):
        digits = value.strip()
        if len(digits) > len(str(MAX_ID)) or int(digits) > MAX_ID:
            raise RestoreError(f"checkpoint: id {digits[:30]}… is larger than any checkpoint id ({MAX_ID})")
        checkpoint_id = int(digits)
        if not storage.is_completed(checkpoint_id):
            known = ", ".join(map(str, storage.completed_ids())) or "none"
            raise CheckpointStorageError(
                f"job {storage.job_id} has no completed checkpoint {checkpoint_id} (retained: {known})"
            )
        return storage.url(storage.chk_dir(checkpoint_id))
    return resolve_under_roots(value, roots)


def request_restore(storage: JobStorage, pointer: str, allow_non_restored_state: bool, dry_run: bool) -> dict[str, Any]:
    """Validate the snapshot at ``pointer`` for the job, then (unless ``dry_run``) request the restore.

    The request (``_restore.json``) is taken by the next checkpoint of the job; the job
    is set RUNNING with a clean failure count. Nothing is written when validation fails.
    """
    snapshot = open_snapshot(pointer)
    snapshot.verify()
    job = storage.load_job()
    nodes = job.topology.get("nodes", {})
    stateful = {uid: n.get("keys", []) for uid, n in nodes.items() if n.get("kind") == "stateful"}
    if not nodes:
        raise RestoreError(
            f"job {storage.job_id} has no recorded topology in {storage.url('_job.json')}: has it ever run here?"
        )
    starting_empty = check_compatible(snapshot, storage.job_id, stateful, allow_non_restored_state)
    cp = snapshot.checkpoint
    for uid, committables in sorted(cp.sinks.items()):
        node = nodes.get(uid, {})
        if node.get("format") == TABLE_FORMAT:
            check_table_committables(
                cp.checkpoint_id, committables, node.get("mode", ""), snapshot.location.url(METADATA), f"sinks.{uid}"
            )
    summary: dict[str, Any] = {
        "job_id": storage.job_id,
        "dag_id": job.topology.get("dag_id", storage.job_id),
        "snapshot": snapshot.location.url(),
        "checkpoint_id": cp.checkpoint_id,
        "type": cp.type.value,
        "operators_restored": sorted(set(cp.operators) & set(stateful)),
        "operators_dropped": sorted(set(cp.operators) - set(stateful)),
        "operators_starting_empty": starting_empty,
        "dry_run": dry_run,
    }
    if not dry_run:
        storage.write_restore_request(
            RestoreRequest(
                request_id=uuid.uuid4().hex,
                location_url=snapshot.location.url(),
                checkpoint_id=cp.checkpoint_id,
                allow_non_restored_state=allow_non_restored_state,
                requested_at=time.time(),
            )
        )
        job.resume()
        storage.save_job(job)
    return summary
