"""The checkpoint metrics: what the coordinator tells them, what they hand Airflow's metrics layer,
and that they never fail a checkpoint. (A real StatsD daemon receives them in
``tests/airflow/test_metrics_statsd.py``.)"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_checkpoint import metrics
from airflow_provider_checkpoint.connectors.kafka.source import KafkaSource
from airflow_provider_checkpoint.core.model import CheckpointPlan, JsonDict
from airflow_provider_checkpoint.exceptions import CheckpointAborted
from airflow_provider_checkpoint.metrics import CheckpointMetrics
from tests.unit.helpers import T0, Env, run_checkpoint


class Backend:
    """Stands in for a StatsD client behind Airflow's stats module: records ``(kind, name, value, tags)``."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, str, float, dict[str, Any]]] = []
        self.fail = fail

    def _call(self, kind: str, stat: str, value: float, tags: dict[str, Any] | None) -> None:
        if self.fail:
            raise OSError("statsd unreachable")
        self.calls.append((kind, stat, value, tags or {}))

    def incr(self, stat: str, count: int = 1, rate: float = 1, *, tags: dict[str, Any] | None = None) -> None:
        self._call("incr", stat, count, tags)

    def gauge(self, stat: str, value: float, rate: float = 1, delta: bool = False, *, tags: Any = None) -> None:
        self._call("gauge", stat, value, tags)

    def timing(self, stat: str, dt: float, *, tags: dict[str, Any] | None = None) -> None:
        self._call("timing", stat, dt, tags)


@pytest.fixture
def backend() -> Iterator[Backend]:
    from airflow.sdk._shared.observability.metrics.base_stats_logger import NoStatsLogger
    from airflow.sdk.observability import stats

    found = Backend()
    stats.initialize(factory=lambda: found, export_legacy_names=True)
    yield found
    stats.initialize(factory=NoStatsLogger, export_legacy_names=True)


class Recorder:
    def __init__(self) -> None:
        self.plans: list[CheckpointPlan] = []
        self.records: list[JsonDict] = []

    def triggered(self, plan: CheckpointPlan) -> None:
        self.plans.append(plan)

    def recorded(self, record: JsonDict) -> None:
        self.records.append(record)


def stored(env: Env, checkpoint_id: int) -> JsonDict:
    return json.loads((env.job_dir / "_stats" / f"{checkpoint_id}.json").read_text())


def test_the_coordinator_reports_every_plan_and_stats_record_it_writes(env: Env) -> None:
    env.coordinator.events = recorder = Recorder()
    plan, _ = run_checkpoint(env, "run-1", T0)
    second = env.coordinator.trigger("run-2", now=T0 + 10)
    with pytest.raises(CheckpointAborted):
        env.coordinator.finalize(second, [], now=T0 + 11)  # no ack: aborted
    assert recorder.plans == [plan, second]
    assert recorder.records == [stored(env, 1), stored(env, 2)]
    assert [r["status"] for r in recorder.records] == ["COMPLETED", "ABORTED"]


def completed_record() -> JsonDict:
    return {
        "checkpoint_id": 7,
        "status": "COMPLETED",
        "duration_seconds": 12.3456,
        "records_in": 500,
        "state_size": 4096,
        "restored": True,
        "sinks": {"a": {"rows": 40}, "b": {"rows": 2}, "bad": {"rows": "x"}},
        "steps": {"s1": {"state_bytes": 1000}, "s2": {"records_in": 500}, "s3": {"state_bytes": 24}},
    }


def test_a_completed_record_gives_tagged_and_named_metrics(backend: Backend) -> None:
    CheckpointMetrics("clicks.v2", []).recorded(completed_record())
    tagged = {(k, n): v for k, n, v, tags in backend.calls if tags == {"job_id": "clicks.v2"}}
    named = {(k, n): v for k, n, v, tags in backend.calls if not tags}
    assert tagged == {
        ("incr", "checkpoint.completed"): 1,
        ("gauge", "checkpoint.last_completed_id"): 7,
        ("gauge", "checkpoint.last_duration"): 12346,
        ("timing", "checkpoint.duration"): 12346,
        ("gauge", "checkpoint.last_full_size"): 4096,
        ("gauge", "checkpoint.last_size"): 1024,
        ("gauge", "checkpoint.last_records_in"): 500,
        ("gauge", "checkpoint.last_records_out"): 42,
        ("incr", "checkpoint.records_in"): 500,
        ("incr", "checkpoint.records_out"): 42,
        ("incr", "checkpoint.restored"): 1,
    }
    assert named == {(k, f"{n}.clicks__v2"): v for (k, n), v in tagged.items()}  # '.' in a value: '__'


def test_an_aborted_record_counts_by_reason_and_failure(backend: Backend) -> None:
    job = CheckpointMetrics("clicks", [])
    job.recorded({"checkpoint_id": 3, "status": "ABORTED", "reason": "expired", "counted": True})
    job.recorded({"checkpoint_id": 4, "status": "ABORTED", "reason": "subsumed", "counted": False})
    assert [(n, v, t) for _, n, v, t in backend.calls] == [
        ("checkpoint.aborted", 1, {"job_id": "clicks", "reason": "expired"}),
        ("checkpoint.aborted.clicks.expired", 1, {}),
        ("checkpoint.failed", 1, {"job_id": "clicks"}),
        ("checkpoint.failed.clicks", 1, {}),
        ("checkpoint.aborted", 1, {"job_id": "clicks", "reason": "subsumed"}),
        ("checkpoint.aborted.clicks.subsumed", 1, {}),
    ]


def test_legacy_names_off_emits_tagged_names_only(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__METRICS__LEGACY_NAMES_ON", "False")
    CheckpointMetrics("clicks", []).recorded(completed_record())
    assert backend.calls and all(tags for *_, tags in backend.calls)


def test_kafka_lag_is_the_offsets_between_the_restored_position_and_the_barrier(backend: Backend) -> None:
    kafka = KafkaSource("orders", ["t"], format="raw")
    restored = {"offsets": {"t": {"0": 10, "1": 5}}, "starts": {}}
    barrier = {"offsets": {"t": {"0": 25, "1": 5, "2": 9}}, "starts": {"t": {"2": 4}}}  # partition 2 is new
    assert kafka.offsets_behind(restored, barrier) == 15 + 0 + 5
    assert kafka.offsets_behind(None, {"offsets": {"t": {"0": 7}}, "starts": {"t": {"0": 0}}}) == 7
    first = {"offsets": {"t": {"0": 25, "1": 5}}, "starts": {"t": {"0": 3, "1": 5}}}  # the job's first barrier
    plan = CheckpointPlan.from_dict(
        {
            "job_id": "j",
            "run_id": "r",
            "barrier": {"checkpoint_id": 1, "trigger_time": T0, "type": "checkpoint", "positions": {"orders": first}},
            "steps": ["s"],
            "timeout_seconds": 60,
        }
    )
    CheckpointMetrics("j", [kafka]).triggered(plan)  # no restore point: every partition from its start
    assert [(n, v, t) for _, n, v, t in backend.calls] == [
        ("checkpoint.source_lag", 22, {"job_id": "j", "source": "orders"}),
        ("checkpoint.source_lag.j.orders", 22, {}),
    ]


def test_a_metrics_error_is_logged_once_and_never_raised(
    backend: Backend, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metrics, "_failed_once", False)
    backend.fail = True
    job = CheckpointMetrics("clicks", [])
    with caplog.at_level(logging.WARNING, logger=metrics.__name__):
        job.recorded(completed_record())
        job.recorded({"status": "ABORTED", "reason": "expired", "counted": True})
    assert [r.getMessage() for r in caplog.records] == [
        "checkpoint metrics not emitted (logged once, checkpoints are unaffected): OSError('statsd unreachable')"
    ]
