"""The ack a spark-submit driver leaves in storage, as the step task reads it back (no Spark)."""

from __future__ import annotations

import json

import pytest

from airflow_provider_checkpoint.core.model import Ack
from airflow_provider_checkpoint.exceptions import CheckpointStorageError, StepDeclined
from airflow_provider_checkpoint.spark.acks import ACK_FILE, read_ack
from tests.unit.helpers import STEP, T0, Env, make_ack


def leave_ack(env: Env, ack: Ack, attempt: int) -> str:
    rel = f"{env.storage.attempt_dir(ack.checkpoint_id, STEP, attempt)}/{ACK_FILE}"
    env.storage.write_atomic(rel, json.dumps(ack.to_dict()).encode())
    return rel


def test_a_verified_ack_is_returned_and_removed(env: Env) -> None:
    plan = env.coordinator.trigger("run-1", now=T0)
    ack = make_ack(env, plan, attempt=2)
    rel = leave_ack(env, ack, 2)
    assert read_ack(env.storage, plan, STEP, 2) == ack
    assert not env.storage.exists(rel)


def test_an_ack_of_another_attempt_is_refused(env: Env) -> None:
    plan = env.coordinator.trigger("run-1", now=T0)
    leave_ack(env, make_ack(env, plan, attempt=1), 2)  # an earlier attempt's ack in this attempt's place
    with pytest.raises(StepDeclined, match="expected"):
        read_ack(env.storage, plan, STEP, 2)


def test_a_missing_ack_declines(env: Env) -> None:
    plan = env.coordinator.trigger("run-1", now=T0)
    with pytest.raises(StepDeclined, match="without writing its ack"):
        read_ack(env.storage, plan, STEP, 1)


def test_an_altered_state_file_is_caught(env: Env) -> None:
    plan = env.coordinator.trigger("run-1", now=T0)
    ack = make_ack(env, plan, attempt=1)
    leave_ack(env, ack, 1)
    handle = next(iter(ack.operators.values())).handles[0]
    (env.job_dir / handle.path).write_bytes(b"x" * handle.size)
    with pytest.raises(CheckpointStorageError, match="checksum"):
        read_ack(env.storage, plan, STEP, 1)


def test_a_state_file_refusal_raised_inside_spark_declines_as_corrupt_state_for_good() -> None:
    from airflow_provider_checkpoint.core.status import AbortReason
    from airflow_provider_checkpoint.exceptions import StateFileError
    from airflow_provider_checkpoint.spark.acks import decline_for

    spark_error = RuntimeError(
        "[USER_RAISED_EXCEPTION] [state file refused] state file file:/x/kg.parquet holds a key of key group 7, "
        "outside the range its handle records [0, 0]: restore another checkpoint SQLSTATE: P0001\n\tat org.apache"
    )
    declined = decline_for(spark_error)
    assert (declined.reason, declined.fatal) == (AbortReason.CORRUPT_STATE, True)
    assert str(declined) == (
        "StateFileError: state file file:/x/kg.parquet holds a key of key group 7, outside the range its handle "
        "records [0, 0]: restore another checkpoint"
    )
    other = decline_for(RuntimeError("[DIVIDE_BY_ZERO] division by zero"))
    assert (other.reason, other.fatal) == (AbortReason.DECLINED, False)
    assert StateFileError.raised_by_spark(RuntimeError("state file x is fine")) is None
