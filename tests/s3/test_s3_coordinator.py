"""The coordinator on a real S3 server (SeaweedFS): one ``_metadata`` of two finalizes, savepoints to S3.

The job's storage root is on S3; the landing directory and the table stay local.
"""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import pytest

from airflow_provider_checkpoint.core.model import CheckpointType, CompletedCheckpoint
from airflow_provider_checkpoint.core.status import AbortReason
from airflow_provider_checkpoint.exceptions import CheckpointAborted, UnsafePathError
from airflow_provider_checkpoint.restore.snapshot import open_snapshot
from airflow_provider_checkpoint.state.handles import StateHandle
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore
from airflow_provider_checkpoint.storage.job_records import JobRecordStore
from tests.s3.s3_job import coordinator_on, counted_requests, s3_ack
from tests.servers.s3 import S3Server
from tests.unit.helpers import JOB, T0, make_ack, make_env, state_rel, target_name


def new_job(server: S3Server, kind: str = "job") -> JobStorage:
    return JobStorage.for_job(server.url(f"{kind}-{uuid.uuid4().hex[:8]}"), JOB, **server.storage_options())


def test_concurrent_finalizes_commit_one_metadata_and_the_loser_finishes_the_winners(
    tmp_path: Path, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deterministic interleaving: the contender completes the checkpoint while the first finalize
    is about to create ``_metadata``; the first one's conditional PUT loses and it finishes the
    committed checkpoint instead of its own."""
    env = make_env(tmp_path)
    first = coordinator_on(env, new_job(s3_server, "finalize"))
    contender = coordinator_on(
        env, JobStorage.for_job(first.storage.url().rsplit("/", 1)[0], JOB, **s3_server.storage_options())
    )
    plan = first.trigger("run-1", now=T0)
    ack = s3_ack(env, first.storage, plan)
    commit = CompletedCheckpointStore.commit
    contended: list[CompletedCheckpoint] = []

    def interleaved(store: CompletedCheckpointStore, checkpoint: CompletedCheckpoint) -> bool:
        if store.storage is first.storage and not contended:
            contended.append(contender.finalize(plan, [ack], now=T0 + 2))
        return commit(store, checkpoint)

    monkeypatch.setattr(CompletedCheckpointStore, "commit", interleaved)
    outcome = first.finalize(plan, [ack], now=T0 + 1)

    assert contended[0].completion_time == T0 + 2
    assert outcome == contended[0], "the loser finishes the committed checkpoint, not its own"
    assert CompletedCheckpointStore(first.storage).load(plan.checkpoint_id) == contended[0]
    chk = first.storage.path(first.storage.chk_dir(plan.checkpoint_id))
    assert [p for p in first.storage.fs.find(chk) if p.endswith("/_metadata")] == [f"{chk}/_metadata"]
    staged = f"rows of chk {plan.checkpoint_id} attempt 1".encode()
    assert env.table_parts() == {target_name(plan.checkpoint_id): staged}, "the sink committed exactly once"
    assert JobRecordStore(first.storage).lease_holder() is None


def test_savepoint_to_s3_is_self_contained_and_the_next_checkpoint_restores_on_s3(
    tmp_path: Path, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention keeps one checkpoint; the savepoint on S3 survives it, complete and verifiable."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    env = make_env(tmp_path, retained=1)
    root, savepoints = (s3_server.url(f"{kind}-{uuid.uuid4().hex[:8]}") for kind in ("ckpt", "savepoints"))
    coordinator = coordinator_on(env, JobStorage.for_job(root, JOB), savepoints)
    target = f"{savepoints}/savepoint-{JOB}-1"
    plan = coordinator.trigger("run-1", CheckpointType.SAVEPOINT, now=T0, options={"savepoint_target": target})
    coordinator.finalize(plan, [s3_ack(env, coordinator.storage, plan)], now=T0 + 1)
    for checkpoint_id in (2, 3):
        nxt = coordinator.trigger(f"run-{checkpoint_id}", now=T0 + 10 * checkpoint_id)
        assert nxt.restore_point is not None and nxt.restore_point.location_url.startswith(f"{root}/{JOB}/chk-")
        coordinator.finalize(nxt, [s3_ack(env, coordinator.storage, nxt)], now=T0 + 10 * checkpoint_id + 1)

    assert CompletedCheckpointStore(coordinator.storage).completed_ids() == [3]
    savepoint = open_snapshot(target)
    assert savepoint.checkpoint.type is CheckpointType.SAVEPOINT and savepoint.checkpoint.relocatable
    savepoint.verify()
    assert savepoint.location.url() == target
    with pytest.raises(UnsafePathError, match="checkpoint tree"):
        coordinator.trigger(
            "run-4", CheckpointType.SAVEPOINT, now=T0 + 40, options={"savepoint_target": f"{root}/{JOB}/sp"}
        )


def test_requests_per_checkpoint_stay_flat_as_the_job_ages(tmp_path: Path, s3_server: S3Server) -> None:
    """Trigger, the step's state upload, finalize and retention of checkpoint 4 and of checkpoint 9 make
    the same S3 requests: nothing lists or reads what earlier checkpoints left behind."""
    env = make_env(tmp_path, retained=2)
    coordinator = coordinator_on(env, new_job(s3_server, "age"))
    costs = {}
    for checkpoint_id in range(1, 10):
        (env.landing / f"f{checkpoint_id}.json").write_bytes(b'{"k": 1}\n')
        with counted_requests(coordinator.storage) as counts:
            plan = coordinator.trigger(f"run-{checkpoint_id}", now=T0 + 10 * checkpoint_id)
            coordinator.finalize(plan, [s3_ack(env, coordinator.storage, plan)], now=T0 + 10 * checkpoint_id + 1)
        costs[checkpoint_id] = counts
    assert costs[4] == costs[9], costs
    assert coordinator.storage.checkpoint_ids() == [8, 9]


def test_kept_state_files_of_older_checkpoints_cost_no_request(tmp_path: Path, s3_server: S3Server) -> None:
    """Incremental state: checkpoint k keeps the state files of every checkpoint since the last full
    version (the directories of checkpoints retention discarded stay for them). Trigger and finalize
    cost the same at chain length 3 and 11: the ``chk-*`` directories are listed once a phase (no
    ``_metadata`` asked of a directory kept for its files, no size asked of a kept file). Once a full
    version replaces the chain, retention deletes the chain and every directory it held with one more
    bulk request than any other checkpoint makes."""
    env = make_env(tmp_path, retained=2)
    coordinator = coordinator_on(env, new_job(s3_server, "chain"))
    chain: list[StateHandle] = []
    costs = {}
    for checkpoint_id in range(1, 15):
        full = checkpoint_id in (1, 13)
        chain = [] if full else chain
        with counted_requests(coordinator.storage) as counts:
            plan = coordinator.trigger(f"run-{checkpoint_id}", now=T0 + 10 * checkpoint_id)
            ack = make_ack(env, plan, extra_handles=tuple(chain))
            coordinator.storage.write_atomic(
                state_rel(checkpoint_id, 1), (env.job_dir / state_rel(checkpoint_id, 1)).read_bytes()
            )
            coordinator.finalize(plan, [ack], now=T0 + 10 * checkpoint_id + 1)
        chain.append(ack.operators["counts"].handles[0])
        costs[checkpoint_id] = counts
    assert costs[4] == costs[12], costs
    assert costs[13] == costs[4], costs  # checkpoint 12, still retained, reads the chain
    extra = costs[14] - costs[4]  # checkpoint 12 discarded: the chain goes, and the directories it held
    assert extra == Counter({"DeleteObjects": 1}), extra
    assert coordinator.storage.checkpoint_ids() == [13, 14]
    assert CompletedCheckpointStore(coordinator.storage).completed_ids() == [13, 14]


def test_failed_metadata_put_aborts_and_leaves_no_metadata(
    tmp_path: Path, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit point's PUT fails: the checkpoint is aborted, nothing of it is left to be taken as committed."""
    env = make_env(tmp_path)
    coordinator = coordinator_on(env, new_job(s3_server))
    plan = coordinator.trigger("run-1", now=T0)
    ack = s3_ack(env, coordinator.storage, plan)
    monkeypatch.setenv("CHECKPOINT_FAULTS", "storage.write:file=_metadata:action=oserror")
    with pytest.raises(CheckpointAborted) as info:
        coordinator.finalize(plan, [ack], now=T0 + 1)
    assert info.value.reason is AbortReason.FINALIZE_FAILURE
    assert not coordinator.storage.fs.exists(coordinator.storage.path(coordinator.storage.chk_dir(1)))
    assert (
        CompletedCheckpointStore(coordinator.storage).completed_ids() == []
        and CompletedCheckpointStore(coordinator.storage).latest_completed() is None
    )
    assert env.table_parts() == {}, "no sink output was committed"
