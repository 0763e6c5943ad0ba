"""The stats record of a checkpoint (core.stats): what a completed record holds, and its history row
read back from stored, untrusted records (a malformed value reads as null, never a crash)."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_checkpoint.core import stats
from airflow_provider_checkpoint.core.model import (
    Ack,
    Barrier,
    CheckpointPlan,
    CheckpointType,
    CompletedCheckpoint,
    RestorePoint,
)

T0 = 1_790_000_000.0


def _plan(requested: bool) -> CheckpointPlan:
    return CheckpointPlan(
        job_id="job",
        run_id="run-3",
        barrier=Barrier(3, T0, CheckpointType.CHECKPOINT, {}),
        steps=("a", "b"),
        timeout_seconds=60,
        restore_point=RestorePoint(2, "file:///jobs/job/chk-2", {}, {}),
        options={"restore_request_id": "0" * 32} if requested else {},
    )


def _ack(step: str, metrics: dict[str, Any], attempt: int = 1) -> Ack:
    return Ack("job", 3, step, attempt, metrics=metrics, attempt_dir=f"chk-3/{step}/attempt-{attempt}")


PARQUET = {"kind": "parquet", "target": "file:///t/orders", "rows": 5, "files": 2, "bytes": 700}
POSTGRES = {"kind": "postgres", "target": "marts.orders", "rows": 4, "files": None, "bytes": None}


def _completion(requested: bool = False) -> dict[str, Any]:
    acks = {
        "a": _ack(
            "a",
            {"state_rows": 9, "state_bytes": 300, "state_incremental": 1, "sinks": {"orders": PARQUET}},
            attempt=2,
        ),
        "b": _ack(
            "b",
            {
                "records_out": 4,
                "sinks": {
                    "pg": POSTGRES,
                    "forged": {"kind": "x", "rows": -1},  # a malformed entry is left out
                    "odd": {"kind": "<b>", "target": 7, "rows": 1, "files": "2", "bytes": 1.5},
                },
            },
        ),
    }
    return stats.completion(_plan(requested), acks, {}, [], T0 + 5, 2)


def test_completion_moves_sinks_out_of_steps_and_adds_attempt_and_state_flags() -> None:
    record = _completion()
    assert record["sinks"] == {
        "orders": {**PARQUET, "step": "a"},
        "pg": {**POSTGRES, "step": "b"},
        "odd": {"kind": "sink", "step": "b", "target": "", "rows": 1, "files": None, "bytes": None},
    }
    assert record["sink_bytes"] == 700
    assert record["steps"]["a"] == {
        "state_rows": 9,
        "state_bytes": 300,
        "state_incremental": True,
        "state_merged_on_driver": False,
        "attempt": 2,
    }
    assert record["steps"]["b"] == {"records_out": 4, "attempt": 1}, "no state: no state flags"


def test_only_a_restore_request_makes_a_checkpoint_restored() -> None:
    plain, restored = _completion(), _completion(requested=True)
    assert (plain["restored"], plain["restored_from"], "restored_from_url" in plain) == (False, 2, False)
    assert (restored["restored"], restored["restored_from"]) == (True, 2)
    assert restored["restored_from_url"] == "file:///jobs/job/chk-2"
    plain_row, restored_row = (
        stats.history_row({"checkpoint_id": 3, **plain}),
        stats.history_row({"checkpoint_id": 3, **restored}),
    )
    assert plain_row is not None and restored_row is not None
    assert (plain_row["restored"], plain_row["restored_from"], plain_row["restored_from_url"]) == (False, None, "")
    assert (restored_row["restored"], restored_row["restored_from"]) == (True, 2)


def _completed(figures: dict[str, Any]) -> CompletedCheckpoint:
    barrier = Barrier(3, T0, CheckpointType.CHECKPOINT, {})
    return CompletedCheckpoint("job", 3, CheckpointType.CHECKPOINT, T0, T0 + 5, 2, barrier, {}, {}, stats=figures)


def test_completed_adds_who_committed_and_the_sinks_commit_figures() -> None:
    facts = {
        "orders": {"commit_time": T0 + 6},
        "pg": {"delta_version": "7", "commit_time": -1},  # malformed: null
        "unknown": {"delta_version": 1},  # no staged entry: not a sink of the record
    }
    record = stats.completed(_completed(_completion()), stats.Committed("trigger", "run-4", facts))
    assert (record["committed_by"], record["committed_by_run_id"]) == ("trigger", "run-4")
    assert record["end_time"] == T0 + 5, "the _metadata's completion time, not when the record is written"
    assert record["sinks"]["orders"] == {**PARQUET, "step": "a", "delta_version": None, "commit_time": T0 + 6}
    assert record["sinks"]["pg"] == {**POSTGRES, "step": "b", "delta_version": None, "commit_time": None}
    assert set(record["sinks"]) == {"orders", "pg", "odd"}
    row = stats.history_row(record)
    assert row is not None
    assert (row["bytes_written"], row["sink_bytes"], row["committed_by"]) == (1000, 700, "trigger")


def test_a_record_from_before_the_sinks_and_restored_fields_reads_as_before() -> None:
    old = {"checkpoint_id": 5, "restored_from": 4, "steps": {"a": {"state_bytes": 30}}}
    row = stats.history_row(old)
    assert row is not None
    assert (row["bytes_written"], row["sink_bytes"], row["restored"], row["restored_from"]) == (30, None, False, None)
    assert row["committed_by"] is None
    old_restore = {**old, "restored_from_url": "file:///sp/savepoint-1"}
    assert stats.history_row(old_restore)["restored"] is True  # type: ignore[index]
    assert stats.history_row(old_restore)["restored_from"] == 4  # type: ignore[index]
    assert stats.history_row({"checkpoint_id": 5})["bytes_written"] is None  # type: ignore[index]


def test_garbage_values_read_as_null() -> None:
    row = stats.history_row(
        {
            "checkpoint_id": 5,
            "restored": "yes",
            "restored_from": 4,
            "sink_bytes": -3,
            "committed_by": "<script>",
            "steps": {"a": {"state_bytes": "10"}, "b": None},
        }
    )
    assert row is not None
    assert (row["restored"], row["restored_from"], row["sink_bytes"], row["committed_by"]) == (False, None, None, None)
    assert row["bytes_written"] is None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
FIELDS = st.sampled_from(
    [
        "checkpoint_id",
        "status",
        "trigger_time",
        "end_time",
        "duration_seconds",
        "records_in",
        "steps",
        "restored",
        "restored_from",
        "restored_from_url",
        "sink_bytes",
        "committed_by",
        "sinks",
        "source_malformed",
        "state_size",
    ]
)


def _check_types(row: dict[str, Any]) -> None:
    for key in ("records_in", "state_rows", "state_size", "bytes_written", "sink_bytes", "files", "restored_from"):
        assert row[key] is None or (type(row[key]) is int and row[key] >= 0), key
    for key in ("trigger_time", "end_time", "duration_seconds"):
        assert row[key] is None or (type(row[key]) is float and math.isfinite(row[key]) and row[key] >= 0), key
    assert type(row["restored"]) is bool
    assert row["committed_by"] in (None, "finalize", "trigger")
    assert row["restored_from"] is None or row["restored"]
    assert all(isinstance(v, str) for v in (row["status"], row["message"], row["run_id"], row["restored_from_url"]))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(FIELDS, JSON, max_size=10), st.integers(0, 2**63 - 1))
def test_history_row_of_any_stored_record_is_typed_or_none(record: dict[str, Any], checkpoint_id: int) -> None:
    assert stats.history_row(record) is None or "checkpoint_id" in record
    row = stats.history_row({**record, "checkpoint_id": checkpoint_id})
    assert row is not None
    _check_types(row)


@settings(max_examples=150, deadline=None)
@given(JSON, JSON, st.dictionaries(st.text(max_size=8), JSON, max_size=4))
def test_completed_from_any_stored_figures_never_crashes(staged: Any, steps: Any, facts: dict[str, Any]) -> None:
    """``_metadata``'s stats and the sinks' commit facts are not trusted either."""
    committed = stats.Committed("finalize", "run-1", facts)
    record = stats.completed(_completed({"sinks": staged, "steps": steps}), committed)
    row = stats.history_row(record)
    assert row is not None
    _check_types(row)


def test_a_sink_target_in_the_record_carries_no_credentials() -> None:
    from airflow_provider_checkpoint.dataflow.graph import redact_url

    assert redact_url("s3://AKIA:secret@bucket/marts/orders") == "s3://bucket/marts/orders"
    assert redact_url("https://u:p@host/t") == "https://host/t"
    assert redact_url("abfs://lake@account.dfs.core.windows.net/t") == "abfs://lake@account.dfs.core.windows.net/t"
    assert redact_url("file:///data/t@1") == "file:///data/t@1", "an @ in the path is kept"
    assert redact_url("orders_table") == "orders_table"


def test_details_read_back_the_record_typed() -> None:
    record = stats.completed(
        _completed(_completion()), stats.Committed("finalize", "run-3", {"orders": {"commit_time": T0 + 6}})
    )
    sinks = {s["uid"]: s for s in stats.sink_details(record)}
    assert sinks["orders"] == {"uid": "orders", **PARQUET, "step": "a", "delta_version": None, "commit_time": T0 + 6}
    assert sinks["pg"]["files"] is None and sinks["pg"]["kind"] == "postgres"
    (a, b) = stats.step_details(record)
    assert (a["step"], a["attempt"], a["incremental"], a["merged_on_driver"], a["state_bytes"]) == (
        "a",
        2,
        True,
        False,
        300,
    )
    assert (b["step"], b["records_out"], b["incremental"], b["alignment_seconds"]) == ("b", 4, None, {})


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["steps", "sinks"]), JSON | st.dictionaries(st.text(max_size=5), JSON)))
def test_details_of_any_stored_record_are_typed(record: dict[str, Any]) -> None:
    for step in stats.step_details(record):
        assert all(step[k] is None or type(step[k]) is int for k in ("attempt", "records_in", "state_rows"))
        assert step["incremental"] in (None, True, False) and isinstance(step["alignment_seconds"], dict)
        assert all(type(v) is int for v in step["input_records"].values())
    for sink in stats.sink_details(record):
        assert sink["kind"] in (*stats.SINK_KINDS, "sink") and isinstance(sink["target"], str)
        assert all(sink[k] is None or type(sink[k]) is int for k in ("rows", "files", "bytes", "delta_version"))
        assert sink["commit_time"] is None or type(sink["commit_time"]) is float
