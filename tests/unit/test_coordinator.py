"""The checkpoint coordinator end to end on the local filesystem, without Spark.

The graph is a FileSource over a landing directory feeding an append ParquetTableSink.
Instead of running the Spark step, each test writes the files a step would write (a
state file under its attempt directory, a staged file under the table's staging area)
and hands the coordinator the corresponding Ack.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from airflow_provider_checkpoint.connectors.files.source import FileSource
from airflow_provider_checkpoint.core import metadata, stats
from airflow_provider_checkpoint.core.model import CheckpointPlan, CheckpointType
from airflow_provider_checkpoint.core.status import AbortReason, JobStatus
from airflow_provider_checkpoint.exceptions import (
    CheckpointAborted,
    CheckpointStorageError,
    InjectedFault,
    JobNotRunning,
)
from airflow_provider_checkpoint.restore.snapshot import open_snapshot
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore
from airflow_provider_checkpoint.storage.job_records import JobRecordStore
from tests.unit.helpers import (
    JOB,
    STEP,
    T0,
    TIMEOUT,
    Env,
    SharedState,
    make_ack,
    make_env,
    run_checkpoint,
    state_rel,
    target_name,
)
from tests.unit.state_files import state_file as parquet_state


# -- trigger --------------------------------------------------------------------------
def test_first_trigger_plans_checkpoint_one(env: Env) -> None:
    plan = env.coordinator.trigger("run-1", now=T0)
    assert plan.checkpoint_id == 1
    assert plan.job_id == JOB
    assert plan.run_id == "run-1"
    assert plan.steps == (STEP,)
    assert plan.restore_point is None
    assert plan.barrier.trigger_time == T0
    assert plan.barrier.type is CheckpointType.CHECKPOINT
    assert plan.barrier.positions == {"events": {"files": {"a.json": 9}}}
    assert plan.timeout_seconds == TIMEOUT
    assert JobRecordStore(env.storage).lease_holder()["run_id"] == "run-1"
    assert CheckpointPlan.from_dict(json.loads((env.chk(1) / "_plan.json").read_bytes())) == plan
    assert env.job_record()["last_checkpoint_id"] == 1


def test_trigger_while_another_run_holds_the_lease(env: Env) -> None:
    env.coordinator.trigger("run-1", now=T0)
    with pytest.raises(CheckpointAborted) as info:
        env.coordinator.trigger("run-2", now=T0 + 1)
    assert info.value.reason is AbortReason.TOO_MANY_CONCURRENT
    assert JobRecordStore(env.storage).lease_holder()["run_id"] == "run-1", (
        "a refused trigger must not release the holder's lease"
    )
    assert env.chk(1).is_dir(), "a refused trigger must not clean up the in-flight checkpoint"


# -- ids ------------------------------------------------------------------------------
def test_ids_increase_across_an_aborted_checkpoint(env: Env) -> None:
    first = env.coordinator.trigger("run-1", now=T0)
    with pytest.raises(CheckpointAborted) as info:
        env.coordinator.finalize(first, [None], now=T0 + 1)
    assert info.value.reason is AbortReason.DECLINED
    assert not env.chk(first.checkpoint_id).exists()
    assert JobRecordStore(env.storage).lease_holder() is None
    second = env.coordinator.trigger("run-2", now=T0 + 10)
    assert second.checkpoint_id > first.checkpoint_id
    # Nothing completed: the same input is planned again.
    assert second.restore_point is None
    assert second.barrier.positions == first.barrier.positions


def test_ids_increase_across_completed_checkpoints(env: Env) -> None:
    seen = []
    for i in range(3):
        plan, _ = run_checkpoint(env, f"run-{i}", T0 + 10 * i)
        seen.append(plan.checkpoint_id)
    assert seen == sorted(set(seen))
    assert seen[0] >= 1


def test_ids_not_reused_when_job_record_is_lost(env: Env) -> None:
    run_checkpoint(env, "run-1", T0)
    (env.job_dir / "_job.json").unlink()
    plan = env.coordinator.trigger("run-2", now=T0 + 10)
    assert plan.checkpoint_id == 2


def test_ids_not_reused_when_job_record_is_lost_and_checkpoint_abandoned(env: Env) -> None:
    first = env.coordinator.trigger("run-1", now=T0)
    JobRecordStore(env.storage).release_lease("run-1")
    (env.job_dir / "_job.json").unlink()
    second = env.coordinator.trigger("run-2", now=T0 + 10)
    assert second.checkpoint_id > first.checkpoint_id


# -- finalize: the happy path ----------------------------------------------------------
def test_finalize_writes_metadata_then_commits_the_sink(env: Env) -> None:
    plan = env.coordinator.trigger("run-1", now=T0)
    ack = make_ack(env, plan, state=b"S1", staged=b"ROWS1")
    completed = env.coordinator.finalize(plan, [ack], now=T0 + 5)

    on_disk = metadata.decode((env.chk(1) / "_metadata").read_bytes())
    assert on_disk == completed
    assert on_disk.checkpoint_id == 1
    assert on_disk.operators == ack.operators
    assert on_disk.sinks == ack.sinks
    assert on_disk.source_positions == {"events": {"files": {"a.json": 9}}}
    assert on_disk.completion_time == T0 + 5
    assert on_disk.restored_from is None
    assert (env.job_dir / state_rel(1, 1)).read_bytes() == b"S1"

    assert env.table_parts() == {target_name(1): b"ROWS1"}
    assert not (env.table / "_staging" / "chk-1").exists()
    log = json.loads((env.table / "_commits" / "0000000001.json").read_bytes())
    assert log.pop("commit_time") == pytest.approx(time.time(), abs=60)
    assert log == {"checkpoint_id": 1, "files": [target_name(1)]}

    assert env.stats(1)["status"] == "COMPLETED"
    assert env.stats(1)["run_id"] == "run-1"
    assert env.stats(1)["committed_by"] == "finalize"
    assert env.stats(1)["committed_by_run_id"] == "run-1"
    assert env.stats(1)["restored"] is False
    assert JobRecordStore(env.storage).lease_holder() is None
    assert env.job_record()["failures"]["last_completed_id"] == 1


def test_next_checkpoint_restores_from_the_last_and_reads_only_new_files(env: Env) -> None:
    run_checkpoint(env, "run-1", T0)
    (env.landing / "b.json").write_bytes(b'{"k": 2}\n{"k": 3}\n')
    plan = env.coordinator.trigger("run-2", now=T0 + 10)
    assert plan.checkpoint_id == 2
    assert plan.restore_point is not None
    assert plan.restore_point.checkpoint_id == 1
    assert plan.restore_point.location_url == env.storage.url("chk-1")
    assert plan.restore_point.base_url is None
    previous = plan.restore_point.source_positions["events"]
    source = env.coordinator.graph.sources[0]
    assert isinstance(source, FileSource)
    assert source.split(previous, plan.barrier.positions["events"]) == {"b.json": 18}
    completed = env.coordinator.finalize(plan, [make_ack(env, plan)], now=T0 + 11)
    assert completed.restored_from == 1


def test_discarded_attempts_files_are_deleted(env: Env) -> None:
    plan = env.coordinator.trigger("run-1", now=T0)
    failed = env.chk(1) / STEP / "attempt-1" / "state" / "junk"  # attempt 1 died without an ack
    failed.parent.mkdir(parents=True)
    failed.write_bytes(b"partial")
    stale = make_ack(env, plan, attempt=2, state=b"attempt two")
    latest = make_ack(env, plan, attempt=3, state=b"attempt three")
    completed = env.coordinator.finalize(plan, [latest, stale], now=T0 + 1)
    assert sorted(p.name for p in (env.chk(1) / STEP).iterdir()) == ["attempt-3"]
    assert completed.operators == latest.operators
    assert (env.job_dir / state_rel(1, 3)).read_bytes() == b"attempt three"
    assert env.table_parts() == {target_name(1): b"rows of chk 1 attempt 3"}


def test_second_finalize_of_the_same_plan_is_a_no_op(env: Env) -> None:
    plan = env.coordinator.trigger("run-1", now=T0)
    ack = make_ack(env, plan, staged=b"ROWS")
    first = env.coordinator.finalize(plan, [ack], now=T0 + 1)
    metadata_bytes = (env.chk(1) / "_metadata").read_bytes()
    log_bytes = (env.table / "_commits" / "0000000001.json").read_bytes()
    # A zombie attempt stages different output for the same file after the commit.
    zombie = env.table / ack.sinks["table"][0]["moves"][0][0]
    zombie.parent.mkdir(parents=True)
    zombie.write_bytes(b"ZOMBIE")

    again = env.coordinator.finalize(plan, [ack], now=T0 + TIMEOUT + 100)  # even past the deadline

    assert again == first
    assert (env.chk(1) / "_metadata").read_bytes() == metadata_bytes
    assert (env.table / "_commits" / "0000000001.json").read_bytes() == log_bytes
    assert env.table_parts() == {target_name(1): b"ROWS"}
    assert env.stats(1)["status"] == "COMPLETED"
    assert env.job_record()["failures"]["failed_ids"] == []
    assert JobRecordStore(env.storage).lease_holder() is None


# -- finalize: crash recovery -----------------------------------------------------------
def test_crash_after_metadata_is_committed_by_the_next_trigger(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = env.coordinator.trigger("run-1", now=T0)
    ack = make_ack(env, plan, staged=b"ROWS")
    monkeypatch.setenv("CHECKPOINT_FAULTS", f"finalize.after_metadata:checkpoint={plan.checkpoint_id}")
    with pytest.raises(InjectedFault):
        env.coordinator.finalize(plan, [ack], now=T0 + 1)

    assert CompletedCheckpointStore(env.storage).is_completed(1), "_metadata was written before the crash"
    assert env.table_parts() == {}, "nothing is visible before the sink commit"
    assert not (env.table / "_commits" / "0000000001.json").exists()
    assert (env.table / ack.sinks["table"][0]["moves"][0][0]).read_bytes() == b"ROWS"
    assert JobRecordStore(env.storage).lease_holder() is None

    monkeypatch.delenv("CHECKPOINT_FAULTS")
    nxt = env.coordinator.trigger("run-2", now=T0 + 10)

    assert env.table_parts() == {target_name(1): b"ROWS"}
    assert (env.table / "_commits" / "0000000001.json").exists()
    assert not (env.table / "_staging" / "chk-1").exists()
    assert nxt.checkpoint_id == 2
    assert nxt.restore_point is not None and nxt.restore_point.checkpoint_id == 1
    assert env.chk(1).is_dir(), "the completed checkpoint is not treated as abandoned"
    record = env.stats(1)
    assert (record["committed_by"], record["committed_by_run_id"]) == ("trigger", "run-2")
    log = json.loads((env.table / "_commits" / "0000000001.json").read_bytes())
    assert record["sinks"] == {
        "table": {
            "kind": "parquet",
            "step": STEP,
            "target": f"file://{env.table}",
            "rows": 1,
            "files": 1,
            "bytes": 4,
            "delta_version": None,
            "commit_time": log["commit_time"],
        }
    }
    assert record["sink_bytes"] == 4
    assert stats.history_row(record)["committed_by"] == "trigger"


def test_crash_after_metadata_is_committed_by_a_finalize_retry(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = env.coordinator.trigger("run-1", now=T0)
    ack = make_ack(env, plan, staged=b"ROWS")
    monkeypatch.setenv("CHECKPOINT_FAULTS", "finalize.after_metadata:checkpoint=1")
    with pytest.raises(InjectedFault):
        env.coordinator.finalize(plan, [ack], now=T0 + 1)
    monkeypatch.delenv("CHECKPOINT_FAULTS")
    completed = env.coordinator.finalize(plan, [ack], now=T0 + 2)
    assert completed.completion_time == T0 + 1, "the retry reads the committed _metadata"
    assert env.table_parts() == {target_name(1): b"ROWS"}
    assert env.stats(1)["status"] == "COMPLETED"
    assert (env.stats(1)["committed_by"], env.stats(1)["committed_by_run_id"]) == ("finalize", "run-1")


def test_failures_reset_by_a_checkpoint_completed_through_recovery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint whose finalize crashed after _metadata is completed: it resets the failure count.

    (Fails on the committed coordinator.py, whose trigger() only committed the sinks on recovery.)
    """
    env = make_env(tmp_path, tolerable=1)
    monkeypatch.delenv("CHECKPOINT_FAULTS", raising=False)
    failed = env.coordinator.trigger("run-1", now=T0)
    with pytest.raises(CheckpointAborted):
        env.coordinator.finalize(failed, [None], now=T0 + 1)  # failure #1 (tolerated)
    plan = env.coordinator.trigger("run-2", now=T0 + 10)
    monkeypatch.setenv("CHECKPOINT_FAULTS", f"finalize.after_metadata:checkpoint={plan.checkpoint_id}")
    with pytest.raises(InjectedFault):
        env.coordinator.finalize(plan, [make_ack(env, plan)], now=T0 + 11)
    monkeypatch.delenv("CHECKPOINT_FAULTS")
    third = env.coordinator.trigger("run-3", now=T0 + 20)  # recovers: checkpoint 2 is completed
    with pytest.raises(CheckpointAborted):
        env.coordinator.finalize(third, [None], now=T0 + 21)  # the first failure since checkpoint 2
    assert env.job_record()["status"] == "RUNNING"


def test_abandoned_checkpoint_is_aborted_by_the_next_trigger(env: Env) -> None:
    first = env.coordinator.trigger("run-1", now=T0)
    make_ack(env, first)  # the step wrote state and staged output, then the run died
    JobRecordStore(env.storage).release_lease("run-1")

    second = env.coordinator.trigger("run-2", now=T0 + 10)

    assert not env.chk(first.checkpoint_id).exists()
    assert not (env.table / "_staging" / f"chk-{first.checkpoint_id}").exists()
    assert env.table_parts() == {}
    stats = env.stats(first.checkpoint_id)
    assert stats["status"] == "ABORTED"
    assert stats["reason"] == "abandoned"
    assert stats["counted"] is True
    assert env.job_record()["failures"]["failed_ids"] == [first.checkpoint_id]
    assert second.checkpoint_id > first.checkpoint_id
    assert env.chk(second.checkpoint_id).is_dir()


def test_expired_lease_of_a_dead_run_is_broken_and_its_checkpoint_abandoned(env: Env) -> None:
    first = env.coordinator.trigger("run-1", now=T0)
    second = env.coordinator.trigger("run-2", now=T0 + TIMEOUT + 1)
    assert JobRecordStore(env.storage).lease_holder()["run_id"] == "run-2"
    assert not env.chk(first.checkpoint_id).exists()
    assert env.stats(first.checkpoint_id)["reason"] == "abandoned"
    assert second.checkpoint_id > first.checkpoint_id


# -- finalize: aborts -------------------------------------------------------------------
@pytest.mark.parametrize("damage", ["flip", "grow", "delete"])
def test_corrupt_state_aborts_the_checkpoint(env: Env, damage: str) -> None:
    plan = env.coordinator.trigger("run-1", now=T0)
    ack = make_ack(env, plan, state=b"0123456789" * 10)
    state_file = env.job_dir / state_rel(1, 1)
    if damage == "flip":
        data = bytearray(state_file.read_bytes())
        data[50] ^= 0xFF
        state_file.write_bytes(bytes(data))
    elif damage == "grow":
        state_file.write_bytes(state_file.read_bytes() + b"!")
    else:
        state_file.unlink()

    with pytest.raises(CheckpointAborted) as info:
        env.coordinator.finalize(plan, [ack], now=T0 + 1)

    assert info.value.reason is AbortReason.CORRUPT_STATE
    assert state_rel(1, 1) in info.value.message
    assert isinstance(info.value.__cause__, CheckpointStorageError)
    assert not env.chk(1).exists()
    assert not (env.table / "_staging" / "chk-1").exists()
    assert env.table_parts() == {}
    assert env.stats(1)["status"] == "ABORTED"
    assert env.stats(1)["reason"] == "corrupt_state"
    assert JobRecordStore(env.storage).lease_holder() is None


def test_late_acks_expire_the_checkpoint(env: Env) -> None:
    plan = env.coordinator.trigger("run-1", now=T0)
    ack = make_ack(env, plan)
    with pytest.raises(CheckpointAborted) as info:
        env.coordinator.finalize(plan, [ack], now=T0 + TIMEOUT + 1)
    assert info.value.reason is AbortReason.EXPIRED
    assert not env.chk(1).exists()
    assert env.table_parts() == {}
    assert env.stats(1)["reason"] == "expired"


def test_failure_in_finalize_before_metadata_aborts(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = env.coordinator.trigger("run-1", now=T0)
    ack = make_ack(env, plan)
    monkeypatch.setenv("CHECKPOINT_FAULTS", "finalize.before_metadata:checkpoint=1")
    with pytest.raises(CheckpointAborted) as info:
        env.coordinator.finalize(plan, [ack], now=T0 + 1)
    assert info.value.reason is AbortReason.FINALIZE_FAILURE
    assert not env.chk(1).exists()
    assert env.table_parts() == {}


def test_too_many_failures_stop_the_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHECKPOINT_FAULTS", raising=False)
    env = make_env(tmp_path, tolerable=1)
    for i in range(2):
        plan = env.coordinator.trigger(f"run-{i}", now=T0 + 10 * i)
        with pytest.raises(CheckpointAborted):
            env.coordinator.finalize(plan, [None], now=T0 + 10 * i + 1)
    record = env.job_record()
    assert record["status"] == JobStatus.FAILED.value
    assert "tolerable_failed_checkpoints=1" in record["status_reason"]
    with pytest.raises(JobNotRunning):
        env.coordinator.trigger("run-9", now=T0 + 100)


def test_a_completed_checkpoint_resets_the_failure_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHECKPOINT_FAULTS", raising=False)
    env = make_env(tmp_path, tolerable=1)
    plan = env.coordinator.trigger("run-1", now=T0)
    with pytest.raises(CheckpointAborted):
        env.coordinator.finalize(plan, [None], now=T0 + 1)
    run_checkpoint(env, "run-2", T0 + 10)
    plan = env.coordinator.trigger("run-3", now=T0 + 20)
    with pytest.raises(CheckpointAborted):
        env.coordinator.finalize(plan, [None], now=T0 + 21)
    assert env.job_record()["status"] == "RUNNING"


# -- retention --------------------------------------------------------------------------
def test_retention_deletes_older_checkpoints_from_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHECKPOINT_FAULTS", raising=False)
    env = make_env(tmp_path, retained=2)
    for i in range(1, 3):
        run_checkpoint(env, f"run-{i}", T0 + 10 * i)
    assert env.chk(1).is_dir() and env.chk(2).is_dir()

    run_checkpoint(env, "run-3", T0 + 30)
    assert not env.chk(1).exists()
    assert env.chk(2).is_dir() and env.chk(3).is_dir()

    run_checkpoint(env, "run-4", T0 + 40)
    assert not env.chk(1).exists() and not env.chk(2).exists()
    for cid in (3, 4):
        assert (env.chk(cid) / "_metadata").is_file()
        assert (env.job_dir / state_rel(cid, 1)).read_bytes() == parquet_state(f"state of chk {cid} attempt 1")
    assert CompletedCheckpointStore(env.storage).completed_ids() == [3, 4]
    # Retention is about checkpoint storage: committed table output stays.
    assert sorted(env.table_parts()) == [target_name(i) for i in range(1, 5)]
    # Every kept checkpoint is fully restorable.
    for cid in (3, 4):
        for snapshot in CompletedCheckpointStore(env.storage).load(cid).operators.values():
            for handle in snapshot.handles:
                env.storage.verify(handle)


def test_retention_never_deletes_savepoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHECKPOINT_FAULTS", raising=False)
    env = make_env(tmp_path, retained=1)
    target = f"file://{tmp_path}/savepoints/savepoint-job-1"
    plan = env.coordinator.trigger("run-1", CheckpointType.SAVEPOINT, now=T0, options={"savepoint_target": target})
    env.coordinator.finalize(plan, [make_ack(env, plan)], now=T0 + 1)
    for i in range(2, 5):
        run_checkpoint(env, f"run-{i}", T0 + 10 * i)
    # the savepoint run's chk-1 in the job directory is history like any checkpoint …
    assert CompletedCheckpointStore(env.storage).completed_ids() == [4]
    # … while the self-contained savepoint survives, complete and verifiable
    savepoint = open_snapshot(target)
    assert savepoint.checkpoint.type is CheckpointType.SAVEPOINT and savepoint.checkpoint.relocatable
    assert savepoint.checkpoint.checkpoint_id == 1
    savepoint.verify()
    assert [sp["checkpoint_id"] for sp in JobRecordStore(env.storage).load().savepoints] == [1]


def test_retention_keeps_files_shared_with_a_kept_checkpoint(shared_state: SharedState) -> None:
    env, shared = shared_state
    assert CompletedCheckpointStore(env.storage).completed_ids() == [2]
    env.storage.verify(shared)


def test_shared_files_survive_the_next_trigger(shared_state: SharedState) -> None:
    env, shared = shared_state
    nxt = env.coordinator.trigger("run-3", now=T0 + 20)
    assert nxt.restore_point is not None
    for snapshot in nxt.restore_point.operators.values():
        for handle in snapshot.handles:
            env.storage.verify(handle)
