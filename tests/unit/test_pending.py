"""PendingCheckpoint: how acks are judged against the plan, and complete-or-abort."""

from __future__ import annotations

import pytest

from airflow_provider_checkpoint.core.model import Ack, Barrier, CheckpointPlan, CheckpointType
from airflow_provider_checkpoint.core.pending import AckOutcome, PendingCheckpoint
from airflow_provider_checkpoint.core.status import AbortReason
from airflow_provider_checkpoint.exceptions import CheckpointAborted
from airflow_provider_checkpoint.state.handles import OperatorSnapshot, StateHandle

JOB = "job-a"
CID = 5
T0 = 1000.0
TIMEOUT = 60.0
STEPS = ("step_one", "step_two")


def make_plan(steps: tuple[str, ...] = STEPS) -> CheckpointPlan:
    return CheckpointPlan(
        job_id=JOB,
        run_id="run-1",
        barrier=Barrier(CID, T0, CheckpointType.CHECKPOINT, {"src": {"files": {}}}),
        steps=steps,
        timeout_seconds=TIMEOUT,
    )


def make_ack(
    step: str = "step_one",
    attempt: int = 1,
    checkpoint_id: int = CID,
    job_id: str = JOB,
    uid: str | None = None,
    records: int = 0,
) -> Ack:
    uid = uid or f"op_{step}"
    snapshot = OperatorSnapshot(
        handles=(StateHandle(f"chk-{checkpoint_id}/{step}/attempt-{attempt}/state/{uid}/f", 10, "sha256:x"),),
        schema="{}",
        keys=("k",),
        max_parallelism=128,
    )
    return Ack(
        job_id=job_id,
        checkpoint_id=checkpoint_id,
        step=step,
        attempt=attempt,
        operators={uid: snapshot},
        sinks={f"sink_{step}": [{"checkpoint_id": checkpoint_id, "attempt": attempt}]},
        metrics={"source_records": {f"src_{step}": records}},
        attempt_dir=f"chk-{checkpoint_id}/{step}/attempt-{attempt}",
    )


NOW = T0 + 1


def test_first_ack_of_a_planned_step_is_accepted() -> None:
    pending = PendingCheckpoint(make_plan())
    ack = make_ack("step_one")
    assert pending.acknowledge(ack, NOW) is AckOutcome.ACCEPTED
    assert pending.acks == {"step_one": ack}
    assert pending.discarded == []
    assert pending.missing_steps == ["step_two"]
    assert not pending.is_fully_acknowledged


def test_duplicate_ack_changes_nothing() -> None:
    pending = PendingCheckpoint(make_plan())
    first = make_ack("step_one", attempt=2, records=1)
    pending.acknowledge(first, NOW)
    # Same step and attempt, different content: still the same attempt, the first one stays.
    again = make_ack("step_one", attempt=2, records=99)
    assert pending.acknowledge(again, NOW) is AckOutcome.DUPLICATE
    assert pending.acks["step_one"] is first
    assert pending.discarded == []
    assert not pending.expired


def test_late_ack_of_an_older_checkpoint_is_discarded() -> None:
    pending = PendingCheckpoint(make_plan())
    late = make_ack("step_one", checkpoint_id=CID - 1)
    assert pending.acknowledge(late, NOW) is AckOutcome.LATE
    assert pending.acks == {}
    assert pending.discarded == [late]


def test_ack_of_a_newer_checkpoint_is_unknown_and_discarded() -> None:
    pending = PendingCheckpoint(make_plan())
    newer = make_ack("step_one", checkpoint_id=CID + 1)
    assert pending.acknowledge(newer, NOW) is AckOutcome.UNKNOWN
    assert pending.acks == {}
    assert pending.discarded == [newer]


def test_ack_of_a_step_not_in_the_plan_is_unknown_and_discarded() -> None:
    pending = PendingCheckpoint(make_plan())
    stranger = make_ack("step_three")
    assert pending.acknowledge(stranger, NOW) is AckOutcome.UNKNOWN
    assert pending.acks == {}
    assert pending.discarded == [stranger]


def test_ack_of_another_job_is_ignored_not_discarded() -> None:
    pending = PendingCheckpoint(make_plan())
    other = make_ack("step_one", job_id="job-b")
    assert pending.acknowledge(other, NOW) is AckOutcome.OTHER_JOB
    assert pending.acks == {}
    assert pending.discarded == [], "files of another job must never be scheduled for deletion"


@pytest.mark.parametrize(
    ("first", "second", "outcome"),
    [(3, 2, AckOutcome.STALE_ATTEMPT), (1, 2, AckOutcome.ACCEPTED)],
    ids=["stale attempt discarded", "newer attempt replaces older"],
)
def test_the_newest_attempt_is_kept_and_the_other_discarded(first: int, second: int, outcome: AckOutcome) -> None:
    pending = PendingCheckpoint(make_plan())
    acks = {n: make_ack("step_one", attempt=n) for n in (first, second)}
    pending.acknowledge(acks[first], NOW)
    assert pending.acknowledge(acks[second], NOW) is outcome
    assert pending.acks["step_one"] is acks[max(first, second)]
    assert pending.discarded == [acks[min(first, second)]]


def test_ack_after_deadline_expires_the_checkpoint() -> None:
    pending = PendingCheckpoint(make_plan())
    pending.acknowledge(make_ack("step_one"), NOW)
    too_late = make_ack("step_two")
    assert pending.acknowledge(too_late, T0 + TIMEOUT + 0.5) is AckOutcome.EXPIRED
    assert pending.expired
    assert "step_two" not in pending.acks
    assert too_late in pending.discarded
    # Even when asked to complete within the deadline, an expired checkpoint aborts.
    with pytest.raises(CheckpointAborted) as info:
        pending.complete(NOW, None)
    assert info.value.reason is AbortReason.EXPIRED


def test_ack_exactly_at_deadline_is_still_in_time() -> None:
    pending = PendingCheckpoint(make_plan())
    assert pending.acknowledge(make_ack("step_one"), T0 + TIMEOUT) is AckOutcome.ACCEPTED
    assert not pending.expired


def test_complete_after_deadline_aborts_expired_even_if_all_acked() -> None:
    pending = PendingCheckpoint(make_plan())
    for step in STEPS:
        pending.acknowledge(make_ack(step), NOW)
    with pytest.raises(CheckpointAborted) as info:
        pending.complete(T0 + TIMEOUT + 1, None)
    assert info.value.reason is AbortReason.EXPIRED
    assert str(CID) in str(info.value)


def test_missing_step_declines_and_names_the_step() -> None:
    pending = PendingCheckpoint(make_plan())
    pending.acknowledge(make_ack("step_one"), NOW)
    with pytest.raises(CheckpointAborted) as info:
        pending.complete(NOW, None)
    assert info.value.reason is AbortReason.DECLINED
    assert "step_two" in info.value.message


def test_complete_merges_every_accepted_ack() -> None:
    plan = make_plan()
    pending = PendingCheckpoint(plan)
    a1 = make_ack("step_one", attempt=1, uid="counts", records=3)
    a2 = make_ack("step_two", attempt=1, uid="totals", records=4)
    old = make_ack("step_one", attempt=0, uid="stale_op", records=100)
    for ack in (old, a1, a2):
        pending.acknowledge(ack, NOW)
    completed = pending.complete(T0 + 2.5, restored_from=4)
    assert completed.job_id == JOB
    assert completed.checkpoint_id == CID
    assert completed.type is CheckpointType.CHECKPOINT
    assert completed.trigger_time == T0
    assert completed.completion_time == T0 + 2.5
    assert completed.restored_from == 4
    assert completed.barrier == plan.barrier
    # The replaced attempt contributes nothing.
    assert completed.operators == {"counts": a1.operators["counts"], "totals": a2.operators["totals"]}
    assert completed.sinks == {**a1.sinks, **a2.sinks}
    assert completed.stats["records_in"] == 7
    assert completed.stats["duration_seconds"] == 2.5
    assert completed.stats["state_size"] == 20
    assert completed.source_positions == {"src": {"files": {}}}


def test_a_step_must_read_the_channel_of_the_accepted_upstream_attempt() -> None:
    from dataclasses import replace

    from airflow_provider_checkpoint.state.handles import ChannelSnapshot

    pending = PendingCheckpoint(make_plan())
    channel = ChannelSnapshot((), "{}", rows=3)
    upstream = replace(make_ack("step_one", attempt=2), channels={"ch": channel})
    stale_read = replace(make_ack("step_two"), inputs={"ch": f"chk-{CID}/step_one/attempt-1"})
    pending.acknowledge(upstream, T0)
    pending.acknowledge(stale_read, T0)
    with pytest.raises(CheckpointAborted, match="step_two read channel ch of .*attempt-1.*attempt-2"):
        pending.complete(T0 + 1, None)

    aligned = replace(stale_read, attempt=2, inputs={"ch": upstream.attempt_dir})
    pending.acknowledge(aligned, T0)
    assert pending.complete(T0 + 1, None).stats["channel_rows"] == 3


def _keeping(ack: Ack, kept: StateHandle) -> Ack:
    """``ack`` with its operator also listing ``kept``, a file of an older checkpoint."""
    uid, snapshot = next(iter(ack.operators.items()))
    operators = {uid: OperatorSnapshot((kept, *snapshot.handles), "{}", ("k",), 128)}
    return Ack(ack.job_id, ack.checkpoint_id, ack.step, ack.attempt, operators, ack.sinks, {}, ack.attempt_dir)


def test_an_ack_keeps_only_files_of_its_restore_point() -> None:
    kept = StateHandle("chk-3/step_one/attempt-1/state/op_step_one/kgr=0/f", 10, "sha256:k", (0, 127))
    point = {"op_step_one": OperatorSnapshot((kept,), "{}", ("k",), 128)}
    for inheritable, ok in (
        (point, True),
        (None, False),
        ({"op_step_one": OperatorSnapshot((), "{}", ("k",), 128)}, False),
    ):
        pending = PendingCheckpoint(make_plan(("step_one",)))
        assert pending.acknowledge(_keeping(make_ack(), kept), T0) is AckOutcome.ACCEPTED
        if ok:
            assert pending.complete(T0 + 1, 3, inheritable).operators["op_step_one"].handles[0] == kept
        else:
            with pytest.raises(CheckpointAborted, match="neither its own nor one of its restore point") as e:
                pending.complete(T0 + 1, 3, inheritable)
            assert e.value.reason is AbortReason.CORRUPT_STATE
    forged = StateHandle(kept.path, 11, kept.checksum, kept.key_groups)  # same path, another size
    pending = PendingCheckpoint(make_plan(("step_one",)))
    pending.acknowledge(_keeping(make_ack(), forged), T0)
    with pytest.raises(CheckpointAborted):
        pending.complete(T0 + 1, 3, point)
