"""Checkpoint metrics read back from a real StatsD daemon (Etsy's ``statsd``, ``tests/servers/statsd.py``).

Real checkpoints of a one-step pipeline through ``dag.test()`` and real Spark: one completed, one
aborted in finalize, a restore through the restore DAG, and the restored checkpoint. Every value the daemon received is
compared with what the checkpoints' ``_stats`` records and ``_metadata`` say, read from the files
here, and the record counts with the events landed.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from airflow_provider_checkpoint.testing.clickstream import land_events
from tests.airflow.conftest import own_dags_folder
from tests.servers.statsd import StatsdDaemon

pytestmark = pytest.mark.airflow
JOB = "metrics_views"

PIPELINE = """
import os

from airflow_provider_checkpoint import CheckpointedPipeline, FileSource, KeyedAggregate, ParquetTableSink

BASE = os.environ["METRICS_DIR"]
with CheckpointedPipeline(dag_id="metrics_views", schedule=None) as pipeline:  # one step
    events = FileSource(uid="events", path=f"{BASE}/landing", format="json", schema="user STRING, page STRING, ts LONG")
    views = KeyedAggregate(uid="page_views", input=events, keys=["page"], aggs={"views": "count"})
    ParquetTableSink(uid="page_views_table", input=views, path=f"{BASE}/page_views", mode="upsert", keys=["page"])
dag = pipeline.dag
"""


@pytest.fixture
def pipeline(restore_dag: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The one-step pipeline, over the storage of ``restore_dag``."""
    monkeypatch.setenv("METRICS_DIR", str(tmp_path / "metrics"))
    (tmp_path / "metrics" / "landing").mkdir(parents=True)
    return own_dags_folder(tmp_path, monkeypatch, JOB, PIPELINE)


@pytest.fixture
def statsd_prefix(statsd_daemon: StatsdDaemon, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Airflow's metrics sent to the daemon under a prefix of this test's own, set up as Airflow's task
    runner does in every task process (``dag.test()`` runs tasks in this process and does not)."""
    from airflow.sdk._shared.observability.metrics.base_stats_logger import NoStatsLogger
    from airflow.sdk.configuration import conf
    from airflow.sdk.observability import stats
    from airflow.sdk.observability.metrics import stats_utils

    prefix = f"t{uuid.uuid4().hex[:8]}"
    for key, value in {"ON": "True", "HOST": "127.0.0.1", "PORT": str(statsd_daemon.port), "PREFIX": prefix}.items():
        monkeypatch.setenv(f"AIRFLOW__METRICS__STATSD_{key}", value)
    stats.initialize(
        factory=stats_utils.get_stats_factory(), export_legacy_names=conf.getboolean("metrics", "legacy_names_on")
    )
    yield prefix
    stats.initialize(factory=NoStatsLogger, export_legacy_names=True)


def received(daemon: StatsdDaemon, prefix: str) -> dict[str, dict[str, Any]]:
    """Every metric of ``prefix`` the daemon holds, once a marker sent last has arrived (UDP)."""
    from airflow.sdk.observability import stats

    stats.incr("test_marker")
    deadline = time.monotonic() + 10
    while f"{prefix}.test_marker" not in daemon.dump("counters"):
        assert time.monotonic() < deadline, "the marker metric never reached the StatsD daemon"
        time.sleep(0.05)  # polling the daemon: UDP datagrams are processed asynchronously
    strip = len(prefix) + 1
    return {
        kind: {k[strip:]: v for k, v in daemon.dump(kind).items() if k.startswith(prefix + ".checkpoint.")}
        for kind in ("counters", "gauges", "timers")
    }


def test_checkpoint_metrics_reach_a_real_statsd_daemon(
    pipeline, restore_dag, statsd_daemon, statsd_prefix, tmp_path, monkeypatch
):
    dag, landing = pipeline.dag, tmp_path / "metrics" / "landing"
    job_dir = tmp_path / "checkpoints" / JOB
    first = land_events(landing, "e1.json", 300, 1)
    assert dag.test().state == "success"  # checkpoint 1
    monkeypatch.setenv("CHECKPOINT_FAULTS", "finalize.before_metadata:checkpoint=2")
    assert dag.test().state == "failed"  # checkpoint 2 (no new input) aborted in finalize
    monkeypatch.delenv("CHECKPOINT_FAULTS")
    second = land_events(landing, "e2.json", 200, 2)
    restore = {"job_id": JOB, "checkpoint": "1", "trigger_pipeline": False}
    assert restore_dag.dag.test(run_conf=restore).state == "success"
    assert dag.test().state == "success"  # checkpoint 3, restored from checkpoint 1: reads e2

    records = {int(p.stem): json.loads(p.read_text()) for p in (job_dir / "_stats").glob("*.json")}
    assert sorted(records) == [1, 2, 3]
    done = [records[1], records[3]]
    assert [r["status"] for r in done] == ["COMPLETED", "COMPLETED"]
    aborted = records[2]
    assert (aborted["status"], aborted["reason"], aborted["counted"]) == ("ABORTED", "finalize_failure", True)
    last = json.loads((job_dir / "chk-3" / "_metadata").read_text())
    assert last["restored_from"] == 1 and records[3]["restored"] is True
    assert [r["records_in"] for r in done] == [len(first), len(second)]
    rows_out = [sum(s["rows"] for s in r["sinks"].values()) for r in done]
    durations = [round(1000 * r["duration_seconds"]) for r in done]
    written = sum(m.get("state_bytes", 0) for m in records[3]["steps"].values())
    assert 0 < written <= last["stats"]["state_size"]

    got = received(statsd_daemon, statsd_prefix)
    counters, gauges, timers = got["counters"], got["gauges"], got["timers"]
    for name in ("", f".{JOB}"):  # the tagged name (StatsD drops tags) and the job's own name
        assert counters[f"checkpoint.completed{name}"] == 2
        assert counters[f"checkpoint.failed{name}"] == 1
        assert counters[f"checkpoint.restored{name}"] == 1
        assert counters[f"checkpoint.records_in{name}"] == len(first) + len(second)
        assert counters[f"checkpoint.records_out{name}"] == sum(rows_out)
        assert gauges[f"checkpoint.last_completed_id{name}"] == 3
        assert gauges[f"checkpoint.last_duration{name}"] == durations[-1]
        assert gauges[f"checkpoint.last_full_size{name}"] == last["stats"]["state_size"] == records[3]["state_size"]
        assert gauges[f"checkpoint.last_size{name}"] == written
        assert gauges[f"checkpoint.last_records_in{name}"] == len(second)
        assert gauges[f"checkpoint.last_records_out{name}"] == rows_out[-1]
        assert timers[f"checkpoint.duration{name}"] == durations
    assert counters["checkpoint.aborted"] == counters[f"checkpoint.aborted.{JOB}.finalize_failure"] == 1
    assert not [n for n in (*counters, *gauges) if "source_lag" in n], "a file source has no lag metric"
    assert sorted(counters) == sorted(
        f"checkpoint.{n}{s}"
        for n in ("completed", "failed", "restored", "records_in", "records_out", "aborted")
        for s in ("", f".{JOB}.finalize_failure" if n == "aborted" else f".{JOB}")
    )
