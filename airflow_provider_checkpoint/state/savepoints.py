"""Savepoints: a completed checkpoint copied, in canonical form, to a fresh directory outside any job's tree."""

from __future__ import annotations

import dataclasses
import os
import posixpath
import shutil
from collections.abc import Sequence
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.core import metadata
from airflow_provider_checkpoint.core.model import CheckpointType, CompletedCheckpoint, JsonDict
from airflow_provider_checkpoint.exceptions import CheckpointStorageError, UnsafePathError, redact, shorten
from airflow_provider_checkpoint.state.files import check_file, range_tables, with_instants, write_state_file
from airflow_provider_checkpoint.state.handles import OperatorSnapshot, StateHandle
from airflow_provider_checkpoint.storage import JobStorage, Location
from airflow_provider_checkpoint.storage.job_storage import JOB_FILE, METADATA, inline_parquet
from airflow_provider_checkpoint.storage.paths import is_local, resolve_under_roots, within

if TYPE_CHECKING:
    pass


def savepoint_target(
    options: JsonDict, allowed_roots: Sequence[str], storage: JobStorage, own: CompletedCheckpoint | None = None
) -> Location | None:
    """The savepoint directory ``options`` name: under an allowed root, fresh (see :func:`check_savepoint_target`),
    opened beside ``storage`` (:meth:`~.Location.beside`)."""
    target = options.get("savepoint_target")
    if not target:
        return None
    try:
        location = storage.beside(resolve_under_roots(str(target), allowed_roots))
        check_savepoint_target(location, storage.root, own)
    except UnsafePathError as e:
        raise UnsafePathError(f"savepoint_target {shorten(target)} refused: {redact(str(e))}") from e
    return location


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
    shown = f"{target.url()}" + (f" (it resolves to {real})" if real != target.base else "")
    refused = f"refusing savepoint target {redact(shown)}"
    if within(real, root) and real.count("/") - root.count("/") != 1:
        raise UnsafePathError(f"{refused}: it lies in a job's checkpoint tree {redact(root)}/<job>/")
    ancestor = real
    while ancestor not in ("", "/"):
        if JobStorage.is_chk_dir(posixpath.basename(ancestor)) or fs.exists(f"{ancestor}/{JOB_FILE}"):
            raise UnsafePathError(
                f"{refused}: {redact(ancestor)} is part of a job's checkpoint tree (a chk-<n> or job directory)"
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
            handles.append(dataclasses.replace(copied, least_end=handle.least_end))
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


def _write_merged(source: Location, state: OperatorSnapshot, target: Location, uid: str) -> list[StateHandle]:
    return [
        write_state_file(
            target, f"state/{uid}/kg-{lo:05d}-{hi:05d}-0000.parquet", with_instants(table, state, uid), (lo, hi)
        )
        for (lo, hi), table in range_tables(source, state, uid)
        if len(table)
    ]
