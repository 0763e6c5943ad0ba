"""Named fault points, switched on by CHECKPOINT_FAULTS."""

from __future__ import annotations

import pytest

from airflow_provider_checkpoint.core.faults import ENV, fault_point, fault_scope
from airflow_provider_checkpoint.exceptions import InjectedFault


def test_env_name() -> None:
    assert ENV == "CHECKPOINT_FAULTS"


def test_off_without_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHECKPOINT_FAULTS", raising=False)
    fault_point("finalize.after_metadata", checkpoint=1)


def test_off_with_empty_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHECKPOINT_FAULTS", "")
    fault_point("finalize.after_metadata", checkpoint=1)


def test_name_without_conditions_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHECKPOINT_FAULTS", "step.before_ack")
    with pytest.raises(InjectedFault, match="step.before_ack"):
        fault_point("step.before_ack", checkpoint=3, attempt=1)


def test_other_name_does_not_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHECKPOINT_FAULTS", "step.before_ack")
    fault_point("step.after_state_write", checkpoint=3, attempt=1)
    fault_point("step.before_ack_extra", checkpoint=3, attempt=1)
    fault_point("step", checkpoint=3, attempt=1)


def test_all_conditions_must_match(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHECKPOINT_FAULTS", "step.before_ack:checkpoint=2:attempt=1")
    with pytest.raises(InjectedFault):
        fault_point("step.before_ack", checkpoint=2, attempt=1, step="s")
    fault_point("step.before_ack", checkpoint=2, attempt=2)
    fault_point("step.before_ack", checkpoint=3, attempt=1)
    fault_point("step.before_ack", checkpoint=2)  # attempt not given: condition unmet


def test_any_of_several_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHECKPOINT_FAULTS", "step.before_ack:checkpoint=2, finalize.after_metadata:checkpoint=4")
    fault_point("finalize.after_metadata", checkpoint=3)
    with pytest.raises(InjectedFault):
        fault_point("finalize.after_metadata", checkpoint=4)
    with pytest.raises(InjectedFault):
        fault_point("step.before_ack", checkpoint=2)


def test_value_containing_equals_sign(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHECKPOINT_FAULTS", "p:sink=a=b")
    with pytest.raises(InjectedFault):
        fault_point("p", sink="a=b")
    fault_point("p", sink="a")


def test_pause_waits_for_resume(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    import threading

    monkeypatch.setenv("CHECKPOINT_FAULTS", "step.before_ack:action=pause")
    monkeypatch.setenv("CHECKPOINT_FAULTS_PAUSE_DIR", str(tmp_path))
    paused = threading.Thread(target=fault_point, args=("step.before_ack",), kwargs={"checkpoint": 1})
    paused.start()
    paused.join(timeout=0.3)
    assert paused.is_alive(), "the fault point must wait for the resume file"
    assert (tmp_path / "step.before_ack.paused").exists()
    (tmp_path / "step.before_ack.resume").touch()
    paused.join(timeout=10)
    assert not paused.is_alive()


def test_fault_scope_adds_keys_that_points_may_override(monkeypatch):
    monkeypatch.setenv(ENV, "finalize.after_metadata:checkpoint=2:attempt=1")
    fault_point("finalize.after_metadata", checkpoint=2)  # no attempt outside a scope: no match
    with fault_scope(attempt=2):
        fault_point("finalize.after_metadata", checkpoint=2)
        with pytest.raises(InjectedFault):
            fault_point("finalize.after_metadata", checkpoint=2, attempt=1)
    with fault_scope(attempt=1), pytest.raises(InjectedFault):
        fault_point("finalize.after_metadata", checkpoint=2)
    fault_point("finalize.after_metadata", checkpoint=2)  # the scope ended
