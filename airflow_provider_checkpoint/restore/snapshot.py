"""A snapshot on storage (a completed checkpoint or savepoint): opened, verified, checked against a job.

A savepoint is a self-contained copy of a completed checkpoint in canonical format:
``_metadata`` (JSON) plus plain Parquet state files under ``state/<uid>/``, referenced
by paths relative to the savepoint directory, so the directory can be moved or copied
and still be restored, and read with pyarrow, pandas, DuckDB or Spark alone.
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.core.model import CompletedCheckpoint, RestorePoint, RestoreRequest
from airflow_provider_checkpoint.exceptions import CheckpointStorageError, RestoreError
from airflow_provider_checkpoint.state.files import check_file, read_inline
from airflow_provider_checkpoint.state.handles import OperatorSnapshot
from airflow_provider_checkpoint.storage import JobStorage, Location
from airflow_provider_checkpoint.storage.job_storage import METADATA, inline_parquet
from airflow_provider_checkpoint.storage.paths import resolve_under_roots

if TYPE_CHECKING:
    pass


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


def verify_state(
    base: Location,
    uid: str,
    state: OperatorSnapshot,
    new_in: str | None = None,
    listed_size: Callable[[str], int | None] = lambda path: None,
) -> None:
    """The state files, or the inline state, of operator ``uid`` are intact.

    Without ``new_in`` (a snapshot to restore or read), each also holds the recorded
    columns (:class:`~airflow_provider_checkpoint.exceptions.StateFileError` otherwise).
    With ``new_in`` (a directory; finalize), files outside it — kept from older
    checkpoints, each hashed when it was written — are checked by size only: the size
    ``listed_size`` gives (a listing of this task), else asked of storage.
    """
    if state.inline is not None and new_in is None:
        read_inline(state, uid)
    elif state.inline is not None:
        inline_parquet(state, uid)
    for handle in state.handles:
        deep = new_in is None or handle.path.startswith(new_in + "/")
        base.verify(handle, deep, None if deep else listed_size(handle.path))
        if new_in is None:
            check_file(base, handle, state, uid)


def open_snapshot(pointer: str, beside: Location | None = None, **storage_options: Any) -> Snapshot:
    """The snapshot at ``pointer``: a checkpoint or savepoint directory, or its ``_metadata``; opened
    ``beside`` a job's storage (:meth:`~.Location.beside`) if given, else with ``storage_options``."""
    directory = pointer.rstrip("/")
    if directory.endswith("/" + METADATA):
        directory = directory[: -len(METADATA) - 1]
    location = beside.beside(directory) if beside is not None else Location.from_url(directory, **storage_options)
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


def open_restore_snapshot(
    request: RestoreRequest,
    allowed_roots: Sequence[str],
    storage: JobStorage,
    stateful_keys: Mapping[str, Sequence[str]],
    declarations: Mapping[str, Mapping[str, str]],
) -> Snapshot:
    """The snapshot ``request`` names: confined to ``allowed_roots``, opened beside the job's ``storage``, its
    state files verified, and compatible with the job's stateful operators (:func:`check_compatible`)."""
    snapshot = open_snapshot(resolve_under_roots(request.location_url, allowed_roots), storage)
    snapshot.verify()
    check_compatible(snapshot, storage.job_id, stateful_keys, request.allow_non_restored_state, declarations)
    return snapshot


def check_compatible(
    snapshot: Snapshot,
    job_id: str,
    stateful_keys: Mapping[str, Sequence[str]],
    allow_non_restored_state: bool,
    declarations: Mapping[str, Mapping[str, str]] | None = None,
) -> list[str]:
    """Validate ``snapshot`` against the job's stateful operators (uid → key columns, and uid → the
    operator's :meth:`~.StatefulOperator.state_declaration` for the operators whose declaration is known).

    Returns the uids that start with empty state; raises :class:`RestoreError` when the
    snapshot belongs to another job, keys changed, a state declaration changed (an entry the
    snapshot records with another text, or that the pipeline no longer declares), or it holds
    state for an operator the pipeline no longer has (unless ``allow_non_restored_state``).
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
        elif declarations is not None and uid in declarations:
            problems += _declaration_changes(uid, dict(state.declaration), declarations[uid])
    if problems:
        raise RestoreError(f"cannot restore {snapshot.location.url()}: " + "; ".join(problems))
    return sorted(set(stateful_keys) - set(cp.operators))


def _declaration_changes(uid: str, stored: Mapping[str, str], declared: Mapping[str, str]) -> list[str]:
    """What of operator ``uid``'s state declaration changed since its state was written, with the ways on."""
    changed = [
        f"{name} {text!r} (the pipeline declares {declared[name]!r})"
        if name in declared
        else f"{name} {text!r} (the pipeline declares none)"
        for name, text in sorted(stored.items())
        if declared.get(name) != text
    ]
    if not changed:
        return []
    return [
        f"the state of operator {uid!r} was written with {', '.join(changed)}, and would be read wrongly: "
        f"deploy the definition it was written with, or give the operator a new uid to start it empty "
        "(restore with allow_non_restored_state to drop the old state)"
    ]
