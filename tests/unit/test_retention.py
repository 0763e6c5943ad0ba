"""Retention: which completed checkpoints are discarded, and which of their files may go."""

from __future__ import annotations

import dataclasses

import pytest

from airflow_provider_checkpoint.core.model import Barrier, CheckpointType, CompletedCheckpoint
from airflow_provider_checkpoint.core.retention import deletable_paths, subsumed
from airflow_provider_checkpoint.state.handles import OperatorSnapshot, StateHandle

CP = CheckpointType.CHECKPOINT
SP = CheckpointType.SAVEPOINT


def chk(checkpoint_id: int, type_: CheckpointType = CP, paths: tuple[str, ...] = ()) -> CompletedCheckpoint:
    handles = tuple(StateHandle(p, 1, "sha256:0") for p in paths)
    return CompletedCheckpoint(
        job_id="j",
        checkpoint_id=checkpoint_id,
        type=type_,
        trigger_time=float(checkpoint_id),
        completion_time=float(checkpoint_id) + 0.5,
        restored_from=None,
        barrier=Barrier(checkpoint_id, float(checkpoint_id), type_, {}),
        operators={"op": OperatorSnapshot(handles, "{}", ("k",), 128)} if handles else {},
        sinks={},
        relocatable=type_ is SP,
    )


def ids(checkpoints: list[CompletedCheckpoint]) -> list[int]:
    return sorted(c.checkpoint_id for c in checkpoints)


def test_keeps_the_n_newest_checkpoints() -> None:
    completed = [chk(i) for i in (4, 1, 5, 2, 3)]  # order of the input must not matter
    assert ids(subsumed(completed, 2)) == [1, 2, 3]
    assert ids(subsumed(completed, 1)) == [1, 2, 3, 4]


@pytest.mark.parametrize("retained", [5, 6, 100])
def test_nothing_discarded_when_at_most_n(retained: int) -> None:
    assert subsumed([chk(i) for i in range(1, 6)], retained) == []


def test_savepoints_are_never_discarded() -> None:
    completed = [chk(1, SP), chk(2), chk(3, SP), chk(4), chk(5), chk(6, SP)]
    discarded = subsumed(completed, 1)
    assert all(c.type is CP for c in discarded)
    assert ids(discarded) == [2, 4]


def test_the_job_history_entry_of_a_savepoint_run_is_a_retained_checkpoint() -> None:
    """Its self-contained copy lives in the savepoint directory; the chk-<id> in the job is history."""
    in_job = dataclasses.replace(chk(2, SP), relocatable=False)
    assert ids(subsumed([chk(1), in_job, chk(3), chk(4)], 2)) == [1, 2]


@pytest.mark.parametrize("retained", [0, -1])
def test_retained_must_be_positive(retained: int) -> None:
    with pytest.raises(ValueError):
        subsumed([chk(1)], retained)


def test_deletable_paths_exclude_files_of_kept_checkpoints() -> None:
    old = chk(1, paths=("chk-1/a", "chk-1/shared"))
    older = chk(2, paths=("chk-2/b",))
    kept = chk(3, paths=("chk-1/shared", "chk-3/c"))
    savepoint = chk(4, SP, paths=("chk-2/b",))
    assert deletable_paths([old, older], [kept]) == {"chk-1/a", "chk-2/b"}
    assert deletable_paths([old, older], [kept, savepoint]) == {"chk-1/a"}


def test_deletable_paths_edge_cases() -> None:
    assert deletable_paths([], [chk(1, paths=("x",))]) == set()
    assert deletable_paths([chk(1, paths=("x", "y"))], []) == {"x", "y"}
