"""Failure semantics of the coordinator: abort reasons, tolerable failures, min pause, the lease.

Driven over real local files with the helpers of ``test_coordinator`` (no Spark, no
Airflow). The race tests fork real processes that contend for the same job directory.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import queue
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_checkpoint.connectors.files.parquet_sink import ParquetTableSink
from airflow_provider_checkpoint.connectors.files.source import FileSource
from airflow_provider_checkpoint.coordinator import CheckpointCoordinator
from airflow_provider_checkpoint.core.model import CheckpointType
from airflow_provider_checkpoint.core.settings import CheckpointSettings
from airflow_provider_checkpoint.core.status import AbortReason, JobStatus
from airflow_provider_checkpoint.dataflow.planner import PipelineGraph
from airflow_provider_checkpoint.dataflow.stateful import KeyedAggregate
from airflow_provider_checkpoint.exceptions import CheckpointAborted, InjectedFault, JobNotRunning, LeaseHeld
from airflow_provider_checkpoint.restore.requests import request_restore
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore
from airflow_provider_checkpoint.storage.job_records import JobRecordStore
from tests.unit.helpers import (
    COUNTED,
    JOB,
    NOT_COUNTED,
    STEP,
    T0,
    TIMEOUT,
    Env,
    SharedState,
    make_ack,
    make_env,
    run_checkpoint,
    target_name,
)


@pytest.fixture(autouse=True)
def _no_faults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHECKPOINT_FAULTS", raising=False)


def with_settings(env: Env, **settings: Any) -> Env:
    """``env`` with a coordinator over the same storage and graph but other settings."""
    new = replace(env.coordinator.settings, **settings)
    return replace(env, coordinator=CheckpointCoordinator(env.storage, env.coordinator.graph, new))


def snapshot_dir(root: Path) -> dict[str, tuple[bytes | None, int]]:
    """Every entry under ``root``: content (None for directories) and mtime, to detect any write."""
    out: dict[str, tuple[bytes | None, int]] = {}
    for p in sorted(root.rglob("*")):
        out[str(p.relative_to(root))] = (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
    return out


def contents(root: Path) -> dict[str, bytes | None]:
    return {k: v[0] for k, v in snapshot_dir(root).items()}


def chk_dirs(env: Env) -> list[str]:
    return sorted(p.name for p in env.job_dir.glob("chk-*"))


# -- which reasons count -------------------------------------------------------------
@pytest.mark.parametrize("reason", sorted(AbortReason), ids=str)
def test_coordinator_abort_counts_only_counted_reasons(tmp_path: Path, reason: AbortReason) -> None:
    env = make_env(tmp_path, tolerable=0)
    plan = env.coordinator.trigger("run-1", now=T0)
    env.coordinator.abort(plan, reason, "because", now=T0 + 1)

    stats = env.stats(plan.checkpoint_id)
    assert stats["status"] == "ABORTED"
    assert stats["reason"] == reason.value
    assert stats["message"] == "because"
    assert stats["counted"] is (reason in COUNTED)
    assert stats["run_id"] == "run-1"
    record = env.job_record()
    assert record["failures"]["failed_ids"] == ([plan.checkpoint_id] if reason in COUNTED else [])
    # tolerable=0: a single counted failure fails the job; an uncounted one never does
    assert record["status"] == ("FAILED" if reason in COUNTED else "RUNNING")
    assert not env.chk(plan.checkpoint_id).exists()


# -- abort reasons through finalize ----------------------------------------------------
def test_decline_with_reason_gives_that_reason(env: Env) -> None:
    plan = env.coordinator.trigger("run-1", now=T0)
    declines = {STEP: {"reason": "corrupt_state", "message": "state file of counts unreadable"}}
    with pytest.raises(CheckpointAborted) as info:
        env.coordinator.finalize(plan, [None], now=T0 + 1, declines=declines)

    assert info.value.reason is AbortReason.CORRUPT_STATE
    assert "state file of counts unreadable" in info.value.message
    assert STEP in info.value.message, "the message still names the step that did not ack"
    stats = env.stats(plan.checkpoint_id)
    assert stats["reason"] == "corrupt_state"
    assert "state file of counts unreadable" in stats["message"]
    assert stats["counted"] is True
    assert not env.chk(plan.checkpoint_id).exists()
    assert JobRecordStore(env.storage).lease_holder() is None


@pytest.mark.parametrize("reason", ["declined", "io_error", "corrupt_state"])
def test_decline_reasons_a_step_reports_are_counted(env: Env, reason: str) -> None:
    plan = env.coordinator.trigger("run-1", now=T0)
    with pytest.raises(CheckpointAborted) as info:
        env.coordinator.finalize(plan, [None], now=T0 + 1, declines={STEP: {"reason": reason, "message": "m"}})
    assert info.value.reason is AbortReason(reason)
    assert env.stats(plan.checkpoint_id)["reason"] == reason
    assert env.job_record()["failures"]["failed_ids"] == [plan.checkpoint_id]


def test_missing_ack_without_declines_is_declined(env: Env) -> None:
    plan = env.coordinator.trigger("run-1", now=T0)
    with pytest.raises(CheckpointAborted) as info:
        env.coordinator.finalize(plan, [None], now=T0 + 1)
    assert info.value.reason is AbortReason.DECLINED
    assert STEP in info.value.message
    stats = env.stats(plan.checkpoint_id)
    assert stats["reason"] == "declined"
    assert STEP in stats["message"]
    assert stats["counted"] is True


def test_decline_of_a_step_that_did_ack_is_ignored(env: Env) -> None:
    """Only steps without an accepted ack can decline: a retry that acked wins over its failed attempt."""
    plan = env.coordinator.trigger("run-1", now=T0)
    ack = make_ack(env, plan, attempt=2)
    completed = env.coordinator.finalize(
        plan, [ack], now=T0 + 1, declines={STEP: {"reason": "io_error", "message": "attempt 1 failed"}}
    )
    assert completed.checkpoint_id == plan.checkpoint_id
    assert env.stats(plan.checkpoint_id)["status"] == "COMPLETED"


def test_decline_with_an_unknown_reason_still_aborts_the_checkpoint(env: Env) -> None:
    plan = env.coordinator.trigger("run-1", now=T0)
    with pytest.raises(CheckpointAborted) as info:
        env.coordinator.finalize(plan, [None], now=T0 + 1, declines={STEP: {"reason": "oom", "message": "boom"}})
    assert info.value.reason is AbortReason.DECLINED
    assert not env.chk(plan.checkpoint_id).exists()
    assert env.stats(plan.checkpoint_id)["counted"] is True


def test_ack_after_the_deadline_expires(env: Env) -> None:
    plan = env.coordinator.trigger("run-1", now=T0)
    ack = make_ack(env, plan)
    with pytest.raises(CheckpointAborted) as info:
        env.coordinator.finalize(plan, [ack], now=T0 + TIMEOUT + 1)
    assert info.value.reason is AbortReason.EXPIRED
    stats = env.stats(plan.checkpoint_id)
    assert stats["reason"] == "expired"
    assert stats["counted"] is True
    assert env.table_parts() == {}
    assert not (env.table / "_staging" / f"chk-{plan.checkpoint_id}").exists()


def test_expiry_wins_over_a_decline(env: Env) -> None:
    plan = env.coordinator.trigger("run-1", now=T0)
    with pytest.raises(CheckpointAborted) as info:
        env.coordinator.finalize(
            plan, [None], now=T0 + TIMEOUT + 1, declines={STEP: {"reason": "io_error", "message": "m"}}
        )
    assert info.value.reason is AbortReason.EXPIRED


# -- tolerable failures -----------------------------------------------------------------
def fail_once(env: Env, run_id: str, now: float) -> int:
    plan = env.coordinator.trigger(run_id, now=now)
    with pytest.raises(CheckpointAborted):
        env.coordinator.finalize(plan, [None], now=now + 1)
    return plan.checkpoint_id


def test_exceeding_tolerable_failures_fails_the_job(tmp_path: Path) -> None:
    env = make_env(tmp_path, tolerable=1)
    first = fail_once(env, "run-1", T0)
    assert env.job_record()["status"] == "RUNNING", "one failure is tolerated"
    second = fail_once(env, "run-2", T0 + 10)

    record = env.job_record()
    assert record["status"] == "FAILED"
    assert record["failures"]["failed_ids"] == [first, second]
    assert f"[{first}, {second}]" in record["status_reason"]
    assert env.stats(second)["counted"] is True

    with pytest.raises(JobNotRunning) as info:
        env.coordinator.trigger("run-3", now=T0 + 20)
    assert info.value.status is JobStatus.FAILED
    assert f"[{first}, {second}]" in str(info.value)
    assert "FAILED" in str(info.value)
    assert JobRecordStore(env.storage).lease_holder() is None, "a refused trigger takes no lease"
    assert chk_dirs(env) == []
    assert env.job_record()["last_checkpoint_id"] == second, "no id was allocated"


def test_a_success_in_between_resets_the_count(tmp_path: Path) -> None:
    env = make_env(tmp_path, tolerable=1)
    fail_once(env, "run-1", T0)
    plan, _ = run_checkpoint(env, "run-2", T0 + 10)
    assert env.job_record()["failures"] == {"last_completed_id": plan.checkpoint_id, "failed_ids": []}
    third = fail_once(env, "run-3", T0 + 20)
    assert env.job_record()["status"] == "RUNNING"
    assert env.job_record()["failures"]["failed_ids"] == [third]
    fourth = fail_once(env, "run-4", T0 + 30)
    assert env.job_record()["status"] == "FAILED"
    assert env.job_record()["failures"]["failed_ids"] == [third, fourth]


def test_the_same_id_aborted_twice_counts_once(tmp_path: Path) -> None:
    env = make_env(tmp_path, tolerable=1)
    plan = env.coordinator.trigger("run-1", now=T0)
    with pytest.raises(CheckpointAborted):
        env.coordinator.finalize(plan, [None], now=T0 + 1)
    # finalize retried (e.g. an Airflow retry of the finalize task), then an explicit abort
    with pytest.raises(CheckpointAborted):
        env.coordinator.finalize(plan, [None], now=T0 + 2)
    env.coordinator.abort(plan, AbortReason.EXPIRED, "again", now=T0 + 3)

    record = env.job_record()
    assert record["failures"]["failed_ids"] == [plan.checkpoint_id]
    assert record["status"] == "RUNNING"
    assert env.stats(plan.checkpoint_id)["counted"] is False, "the repeated abort was not counted"
    second = fail_once(env, "run-2", T0 + 10)
    assert env.job_record()["status"] == "FAILED"
    assert env.job_record()["failures"]["failed_ids"] == [plan.checkpoint_id, second]


def test_uncounted_aborts_never_fail_the_job(tmp_path: Path) -> None:
    env = make_env(tmp_path, tolerable=0)
    for i, reason in enumerate(sorted(NOT_COUNTED)):
        plan = env.coordinator.trigger(f"run-{i}", now=T0 + 10 * i)
        env.coordinator.abort(plan, reason, "not a failure", now=T0 + 10 * i + 1)
        JobRecordStore(env.storage).release_lease(plan.run_id)  # abort() leaves the lease to finalize's caller
    assert env.job_record()["status"] == "RUNNING"
    assert env.job_record()["failures"]["failed_ids"] == []


def test_abort_of_an_id_not_newer_than_the_last_completed_is_not_counted(env: Env) -> None:
    old = env.coordinator.trigger("run-1", now=T0)
    env.coordinator.finalize(old, [make_ack(env, old)], now=T0 + 1)
    run_checkpoint(env, "run-2", T0 + 10)
    env.coordinator.abort(old, AbortReason.DECLINED, "late abort of an old plan", now=T0 + 20)
    assert env.job_record()["failures"]["failed_ids"] == []


# -- min pause --------------------------------------------------------------------------
@pytest.fixture
def paused(tmp_path: Path) -> Env:
    """A job with one completed checkpoint (completion at T0 + 1) and a 60 s minimum pause."""
    env = with_settings(make_env(tmp_path), min_pause_between_checkpoints_seconds=60.0)
    run_checkpoint(env, "run-1", T0)
    assert CompletedCheckpointStore(env.storage).load(1).completion_time == T0 + 1
    return env


def test_periodic_trigger_within_min_pause_is_refused_and_writes_nothing(paused: Env) -> None:
    before = contents(paused.job_dir)
    table_before = contents(paused.table)
    with pytest.raises(CheckpointAborted) as info:
        paused.coordinator.trigger("run-2", now=T0 + 1 + 10, periodic=True)

    assert info.value.reason is AbortReason.MIN_PAUSE
    assert not info.value.reason.counts_as_failure
    assert "60" in info.value.message
    assert contents(paused.job_dir) == before, "no chk-2, no stats, no lease, same _job.json"
    assert contents(paused.table) == table_before
    assert chk_dirs(paused) == ["chk-1"]
    assert paused.job_record()["last_checkpoint_id"] == 1
    assert JobRecordStore(paused.storage).lease_holder() is None
    # the refusal did not consume an id
    assert paused.coordinator.trigger("run-3", now=T0 + 1 + 61, periodic=True).checkpoint_id == 2


def test_periodic_trigger_after_min_pause(paused: Env) -> None:
    plan = paused.coordinator.trigger("run-2", now=T0 + 1 + 61, periodic=True)
    assert plan.checkpoint_id == 2
    assert JobRecordStore(paused.storage).lease_holder()["run_id"] == "run-2"


def test_manual_trigger_ignores_min_pause(paused: Env) -> None:
    plan = paused.coordinator.trigger("run-2", now=T0 + 1 + 10, periodic=False)
    assert plan.checkpoint_id == 2
    assert plan.barrier.type is CheckpointType.CHECKPOINT


def test_savepoint_ignores_min_pause(paused: Env) -> None:
    plan = paused.coordinator.trigger("run-2", CheckpointType.SAVEPOINT, now=T0 + 1 + 10, periodic=True)
    assert plan.checkpoint_id == 2
    assert plan.barrier.type is CheckpointType.SAVEPOINT


def test_min_pause_does_not_apply_before_the_first_checkpoint(tmp_path: Path) -> None:
    env = with_settings(make_env(tmp_path), min_pause_between_checkpoints_seconds=60.0)
    assert env.coordinator.trigger("run-1", now=T0, periodic=True).checkpoint_id == 1


# -- the lease ----------------------------------------------------------------------------
def test_second_trigger_while_the_lease_is_held_writes_nothing(env: Env) -> None:
    first = env.coordinator.trigger("run-1", now=T0)
    make_ack(env, first)  # the step of run-1 is busy writing
    before = snapshot_dir(env.job_dir)
    table_before = snapshot_dir(env.table)
    time.sleep(0.01)  # a rewrite would change an mtime

    with pytest.raises(CheckpointAborted) as info:
        env.coordinator.trigger("run-2", now=T0 + 1)

    assert info.value.reason is AbortReason.TOO_MANY_CONCURRENT
    assert "run-1" in info.value.message
    assert snapshot_dir(env.job_dir) == before
    assert snapshot_dir(env.table) == table_before
    assert JobRecordStore(env.storage).lease_holder()["run_id"] == "run-1"
    # the holder still completes its checkpoint
    assert env.coordinator.finalize(first, [make_ack(env, first)], now=T0 + 2).checkpoint_id == first.checkpoint_id


def test_lease_of_a_dead_holder_is_broken_and_its_checkpoint_abandoned(env: Env) -> None:
    first = env.coordinator.trigger("run-1", now=T0)
    make_ack(env, first)  # state and staged output of the dead run
    asked: list[dict] = []

    def holder_alive(holder: dict) -> bool:
        asked.append(holder)
        return False

    second = env.coordinator.trigger("run-2", now=T0 + 10, holder_alive=holder_alive)

    assert [h["run_id"] for h in asked] == ["run-1"]
    assert asked[0]["dag_id"] == JOB
    assert JobRecordStore(env.storage).lease_holder()["run_id"] == "run-2"
    assert second.checkpoint_id == first.checkpoint_id + 1
    assert not env.chk(first.checkpoint_id).exists()
    assert not (env.table / "_staging" / f"chk-{first.checkpoint_id}").exists()
    stats = env.stats(first.checkpoint_id)
    assert stats["status"] == "ABORTED"
    assert stats["reason"] == "abandoned"
    assert stats["counted"] is True
    assert env.job_record()["failures"]["failed_ids"] == [first.checkpoint_id]
    assert chk_dirs(env) == [f"chk-{second.checkpoint_id}"]


def test_lease_of_a_live_holder_is_not_broken(env: Env) -> None:
    env.coordinator.trigger("run-1", now=T0)
    before = snapshot_dir(env.job_dir)
    with pytest.raises(CheckpointAborted) as info:
        env.coordinator.trigger("run-2", now=T0 + 10, holder_alive=lambda holder: True)
    assert info.value.reason is AbortReason.TOO_MANY_CONCURRENT
    assert JobRecordStore(env.storage).lease_holder()["run_id"] == "run-1"
    assert snapshot_dir(env.job_dir) == before
    assert env.chk(1).is_dir()


def test_holder_alive_is_not_asked_for_our_own_lease(env: Env) -> None:
    env.coordinator.trigger("run-1", now=T0)
    JobRecordStore(env.storage).acquire_lease("run-1", 60, now=T0 + 1, holder_alive=lambda h: pytest.fail("asked"))
    assert JobRecordStore(env.storage).lease_holder()["run_id"] == "run-1"


def test_retention_leftovers_do_not_rewrite_a_completed_checkpoint_as_abandoned(shared_state: SharedState) -> None:
    env, shared = shared_state
    run_checkpoint(env, "run-3", T0 + 20)  # discards chk-2, and with it the last reference to chk-1's file
    assert env.stats(1)["status"] == "COMPLETED"

    env.coordinator.trigger("run-4", now=T0 + 30)

    assert env.stats(1)["status"] == "COMPLETED"
    assert not env.chk(1).exists()


# -- races between processes ---------------------------------------------------------------
ROUNDS = 40
CONTENDERS = 4
_MP = multiprocessing.get_context("fork")


def _slow_exclusive_writes(delay: float) -> None:
    """Delay every write to a file opened for exclusive creation (a slow disk, a preempted process)."""
    from fsspec.implementations.local import LocalFileOpener

    original = LocalFileOpener.write

    def write(self: LocalFileOpener, *args: Any, **kwargs: Any) -> Any:
        if "x" in self.mode:
            time.sleep(delay)
        return original(self, *args, **kwargs)

    LocalFileOpener.write = write  # type: ignore[method-assign]  # only in the forked child


def _acquire(root: str, run_id: str, barrier: Any, results: Any, write_delay: float) -> None:
    if write_delay:
        _slow_exclusive_writes(write_delay)
    storage = JobStorage.for_job(root, JOB)
    barrier.wait(timeout=60)
    try:
        JobRecordStore(storage).acquire_lease(run_id, 600, now=T0)
        results.put((run_id, "won"))
    except LeaseHeld:
        results.put((run_id, "held"))
    except BaseException as e:  # noqa: BLE001 - reported to the test
        results.put((run_id, repr(e)))


def _coordinator_for(root: Path) -> CheckpointCoordinator:
    source = FileSource("events", str(root / "landing"), "json", "k INT")
    counts = KeyedAggregate("counts", source, keys=["k"], aggs={"n": "count"})
    sink = ParquetTableSink("table", counts, str(root / "table"), mode="append")
    storage = JobStorage.for_job(str(root / "ckpt"), JOB)
    settings = CheckpointSettings(retained_checkpoints=3, checkpoint_timeout_seconds=TIMEOUT)
    return CheckpointCoordinator(storage, PipelineGraph([source, counts, sink]), settings)


def _trigger(root: str, run_id: str, barrier: Any, results: Any, write_delay: float) -> None:
    if write_delay:
        _slow_exclusive_writes(write_delay)
    coordinator = _coordinator_for(Path(root))
    barrier.wait(timeout=60)
    try:
        plan = coordinator.trigger(run_id, now=T0)
        results.put((run_id, f"plan {plan.checkpoint_id}"))
    except CheckpointAborted as e:
        results.put((run_id, f"aborted {e.reason.value}"))
    except BaseException as e:  # noqa: BLE001 - reported to the test
        results.put((run_id, repr(e)))


def contend(target: Any, root: str, write_delay: float = 0.0) -> dict[str, str]:
    """Start CONTENDERS processes together behind a barrier; each one's outcome by run id."""
    barrier = _MP.Barrier(CONTENDERS)
    results = _MP.Queue()
    procs = [
        _MP.Process(target=target, args=(root, f"run-{i}", barrier, results, write_delay)) for i in range(CONTENDERS)
    ]
    for p in procs:
        p.start()
    outcomes: dict[str, str] = {}
    try:
        for _ in procs:
            run_id, outcome = results.get(timeout=60)
            outcomes[run_id] = outcome
    except queue.Empty:
        pass
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0, f"contender exited with {p.exitcode}: {outcomes}"
    assert len(outcomes) == CONTENDERS, outcomes
    return outcomes


def check_lease_round(root: Path, outcomes: dict[str, str], label: str) -> None:
    winners = [r for r, o in outcomes.items() if o == "won"]
    assert len(winners) == 1, f"{label}: {outcomes}"
    assert sorted(outcomes.values()) == ["held"] * (CONTENDERS - 1) + ["won"], f"{label}: {outcomes}"
    lease = json.loads((root / JOB / "_lease").read_bytes())
    assert lease["run_id"] == winners[0], f"{label}: _lease names {lease['run_id']}, winner {winners[0]}"


def check_trigger_round(root: Path, outcomes: dict[str, str], label: str) -> None:
    planned = [r for r, o in outcomes.items() if o.startswith("plan")]
    assert len(planned) == 1, f"{label}: {outcomes}"
    assert outcomes[planned[0]] == "plan 1", f"{label}: {outcomes}"
    assert sorted(o for o in outcomes.values() if o != "plan 1") == ["aborted too_many_concurrent"] * (
        CONTENDERS - 1
    ), f"{label}: {outcomes}"
    job_dir = root / "ckpt" / JOB
    assert sorted(p.name for p in job_dir.glob("chk-*")) == ["chk-1"], label
    record = json.loads((job_dir / "_job.json").read_bytes())
    assert record["last_checkpoint_id"] == 1, label
    assert record["failures"]["failed_ids"] == [], label
    assert not (job_dir / "_stats").exists(), f"{label}: nothing was aborted"
    assert json.loads((job_dir / "_lease").read_bytes())["run_id"] == planned[0], label


RACE_BUG = (
    "job_storage.py:77-85,250-262: create_exclusive creates _lease with open('xb') and writes the body afterwards; a "
    "contender that reads the lease in between sees an empty file, lease_holder() reports it '<unreadable lease>' "
    "with expires_at 0, and acquire_lease breaks it (_break_lease re-reads the same empty file, so the check "
    "passes) and creates its own lease: two runs hold the lease. Without a delay this hits a few percent of "
    "rounds, so this test is flaky rather than reliably failing (hence not strict)"
)


def test_lease_race_has_exactly_one_winner(tmp_path: Path) -> None:
    for i in range(ROUNDS):
        root = tmp_path / f"round-{i}"
        root.mkdir()
        check_lease_round(root, contend(_acquire, str(root)), f"round {i}")


def test_trigger_race_has_exactly_one_winner(tmp_path: Path) -> None:
    for i in range(ROUNDS):
        root = tmp_path / f"round-{i}"
        (root / "landing").mkdir(parents=True)
        (root / "landing" / "a.json").write_bytes(b'{"k": 1}\n')
        check_trigger_round(root, contend(_trigger, str(root)), f"round {i}")


@pytest.mark.parametrize("via", ["acquire_lease", "trigger"])
def test_race_with_a_slow_lease_write_has_exactly_one_winner(tmp_path: Path, via: str) -> None:
    """The same race, with 0.3 s between creating ``_lease`` and writing its body."""
    for i in range(3):
        root = tmp_path / f"round-{i}"
        if via == "acquire_lease":
            root.mkdir()
            check_lease_round(root, contend(_acquire, str(root), write_delay=0.3), f"round {i}")
        else:
            (root / "landing").mkdir(parents=True)
            (root / "landing" / "a.json").write_bytes(b'{"k": 1}\n')
            check_trigger_round(root, contend(_trigger, str(root), write_delay=0.3), f"round {i}")


def test_lease_is_never_visible_without_its_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Deterministic interleaving: run-2 tries right before run-1 links its complete lease into place."""
    import airflow_provider_checkpoint.storage.writes as writes

    winner = JobStorage.for_job(str(tmp_path), JOB)
    contender = JobStorage.for_job(str(tmp_path), JOB)
    original = writes.os.link
    seen: list[str] = []

    def link(src: str, dst: str) -> None:
        if not seen:
            seen.append("interleaved")
            try:
                JobRecordStore(contender).acquire_lease("run-2", 600, now=T0)
                seen.append("run-2 acquired")
            except LeaseHeld:
                seen.append("run-2 refused")
        original(src, dst)

    monkeypatch.setattr(writes.os, "link", link)
    with pytest.raises(LeaseHeld):
        JobRecordStore(winner).acquire_lease("run-1", 600, now=T0)
    monkeypatch.undo()

    assert seen == ["interleaved", "run-2 acquired"]
    assert JobRecordStore(winner).lease_holder()["run_id"] == "run-2"
    assert not list((tmp_path / JOB).glob(".*.tmp")), "no temporary lease file is left behind"


# -- fault points -------------------------------------------------------------------------
def test_oserror_writing_metadata_aborts_as_finalize_failure(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = env.coordinator.trigger("run-1", now=T0)
    ack = make_ack(env, plan)
    monkeypatch.setenv("CHECKPOINT_FAULTS", "storage.write:file=_metadata:action=oserror")

    with pytest.raises(CheckpointAborted) as info:
        env.coordinator.finalize(plan, [ack], now=T0 + 1)

    assert info.value.reason is AbortReason.FINALIZE_FAILURE
    assert isinstance(info.value.__cause__, OSError)
    assert "storage.write" in info.value.message
    assert not CompletedCheckpointStore(env.storage).is_completed(plan.checkpoint_id)
    assert not env.chk(plan.checkpoint_id).exists()
    assert list(env.job_dir.rglob("_metadata")) == []
    # the sink was not committed, and its staged output is gone
    assert env.table_parts() == {}
    assert not (env.table / "_commits").exists()
    assert not (env.table / "_staging" / f"chk-{plan.checkpoint_id}").exists()
    stats = env.stats(plan.checkpoint_id)
    assert stats["reason"] == "finalize_failure"
    assert stats["counted"] is True
    assert JobRecordStore(env.storage).lease_holder() is None
    monkeypatch.delenv("CHECKPOINT_FAULTS")
    assert env.coordinator.trigger("run-2", now=T0 + 10).checkpoint_id == plan.checkpoint_id + 1


def test_oserror_after_the_commit_point_propagates_and_recovery_completes(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``_metadata`` nothing aborts: the sink's commit log write fails, the next trigger finishes it."""
    plan = env.coordinator.trigger("run-1", now=T0)
    ack = make_ack(env, plan, staged=b"ROWS")
    monkeypatch.setenv("CHECKPOINT_FAULTS", f"storage.write:file={plan.checkpoint_id:010d}.json:action=oserror")
    with pytest.raises(OSError, match="storage.write") as info:
        env.coordinator.finalize(plan, [ack], now=T0 + 1)
    assert not isinstance(info.value, CheckpointAborted)
    assert CompletedCheckpointStore(env.storage).is_completed(plan.checkpoint_id)
    assert not (env.table / "_commits" / f"{plan.checkpoint_id:010d}.json").exists()
    assert JobRecordStore(env.storage).lease_holder() is None

    monkeypatch.delenv("CHECKPOINT_FAULTS")
    nxt = env.coordinator.trigger("run-2", now=T0 + 10)
    assert env.table_parts() == {target_name(plan.checkpoint_id): b"ROWS"}
    assert (env.table / "_commits" / f"{plan.checkpoint_id:010d}.json").exists()
    assert env.stats(plan.checkpoint_id)["status"] == "COMPLETED"
    assert env.job_record()["failures"]["failed_ids"] == []
    assert nxt.restore_point is not None and nxt.restore_point.checkpoint_id == plan.checkpoint_id


def test_a_restore_whose_checkpoint_completed_is_not_taken_again_after_its_finalize_died(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpoint 3 takes a restore to 1 and writes ``_metadata``, then its finalize dies before it
    commits the sinks and removes the request. The next trigger commits 3 and continues from it: it
    used to restore to 1 again without committing 3, so that once that run failed, the run after it
    continued from 3 and 3's output (here the replayed file b.json) never reached the table.

    Found while modelling restores for tests/spark/test_held_rows_machine.py."""
    run_checkpoint(env, "run-1", T0)  # a.json
    (env.landing / "b.json").write_bytes(b'{"k": 2}\n')
    run_checkpoint(env, "run-2", T0 + 5)
    request_restore(env.storage, env.storage.url("chk-1"), False, False)
    third = env.coordinator.trigger("run-3", now=T0 + 10)
    assert third.restore_point is not None and third.restore_point.checkpoint_id == 1
    monkeypatch.setenv("CHECKPOINT_FAULTS", "finalize.after_metadata")
    with pytest.raises(InjectedFault):
        env.coordinator.finalize(third, [make_ack(env, third)], now=T0 + 11)
    monkeypatch.delenv("CHECKPOINT_FAULTS")

    fourth = env.coordinator.trigger("run-4", now=T0 + 20)
    assert fourth.restore_point is not None and fourth.restore_point.checkpoint_id == 3
    assert JobRecordStore(env.storage).load_restore_request() is None
    with pytest.raises(CheckpointAborted):
        env.coordinator.finalize(fourth, [], now=T0 + 21)  # its step never acked
    run_checkpoint(env, "run-5", T0 + 30)
    assert sorted(env.table_parts()) == [target_name(1), target_name(3), target_name(5)]


def test_oserror_writing_the_plan_fails_the_trigger_without_holding_the_lease(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHECKPOINT_FAULTS", "storage.write:file=_plan.json:action=oserror")
    with pytest.raises(OSError, match="storage.write"):
        env.coordinator.trigger("run-1", now=T0)
    assert JobRecordStore(env.storage).lease_holder() is None
    assert chk_dirs(env) == []
    monkeypatch.delenv("CHECKPOINT_FAULTS")
    plan = env.coordinator.trigger("run-2", now=T0 + 10)
    assert plan.checkpoint_id == 2, "the id allocated by the failed trigger is not reused"


def test_kill_action_kills_the_process() -> None:
    code = "from airflow_provider_checkpoint.core.faults import fault_point\nfault_point('x', a=1)\nprint('alive')"
    environment = {**os.environ, "CHECKPOINT_FAULTS": "x:a=1:action=kill"}
    result = subprocess.run(
        [sys.executable, "-c", code], env=environment, capture_output=True, timeout=120, cwd=Path(__file__).parents[2]
    )
    assert result.returncode == -signal.SIGKILL == -9, result.stderr
    assert b"alive" not in result.stdout


def test_kill_action_only_where_the_conditions_match() -> None:
    code = "from airflow_provider_checkpoint.core.faults import fault_point\nfault_point('x', a=2)\nprint('alive')"
    environment = {**os.environ, "CHECKPOINT_FAULTS": "x:a=1:action=kill"}
    result = subprocess.run(
        [sys.executable, "-c", code], env=environment, capture_output=True, timeout=120, cwd=Path(__file__).parents[2]
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == b"alive"
