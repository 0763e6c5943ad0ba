"""A sink's housekeeping failing after the commit (a Delta log checkpoint, the deletion of another attempt's
files): work no guarantee depends on. Through the real coordinator and a real Delta table, without Spark (the
tests write what a step would stage): the checkpoint completes, its rows are in the table once (read back by
delta-rs), one warning says what failed, and the next checkpoint's finalize, or a retry of the finalize, does
what was left. Failures are injected at the project's fault points (``storage.write``, ``storage.delete``)."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_checkpoint.connectors.base import committer
from airflow_provider_checkpoint.connectors.delta.sink import DeltaTableSink
from airflow_provider_checkpoint.connectors.files.source import FileSource
from airflow_provider_checkpoint.coordinator import CheckpointCoordinator
from airflow_provider_checkpoint.core.faults import ENV as FAULTS
from airflow_provider_checkpoint.core.model import Ack, CheckpointPlan, CompletedCheckpoint
from airflow_provider_checkpoint.core.settings import CheckpointSettings
from airflow_provider_checkpoint.dataflow.planner import PipelineGraph
from airflow_provider_checkpoint.exceptions import InjectedFault
from airflow_provider_checkpoint.jobs.audit import audit_job
from airflow_provider_checkpoint.storage import JobStorage

JOB, SINK = "lake_job", "lake"
STEP = f"step_{SINK}"


class Lake:
    """A job of one FileSource appending to a Delta table; each checkpoint's step "ran" twice: attempt 1 staged
    a file and died, attempt 2 staged its own and acked."""

    def __init__(self, tmp_path: Path) -> None:
        from deltalake import DeltaTable

        self.landing, self.table = tmp_path / "landing", tmp_path / "table"
        self.landing.mkdir()
        source = FileSource("events", str(self.landing), "json", "k STRING, v LONG")
        self.sink = DeltaTableSink(SINK, source, str(self.table))
        self.storage = JobStorage.for_job(str(tmp_path / "ckpt"), JOB)
        settings = CheckpointSettings(retained_checkpoints=3, checkpoint_timeout_seconds=600.0)
        graph = PipelineGraph([source, self.sink])
        self.coordinator = CheckpointCoordinator(self.storage, graph, settings, None, [f"file://{tmp_path}/ckpt"])
        self.sink.claim(JOB)
        DeltaTable.create(str(self.table), pa.schema([("k", pa.string()), ("v", pa.int64())]))

    def staged(self, checkpoint_id: int, attempt: int) -> dict[str, object]:
        """Stage checkpoint ``checkpoint_id``'s two rows as attempt ``attempt``: its committable add."""
        relative = f"chk-{checkpoint_id}/{JOB}/{STEP}/attempt-{attempt}/part-c{checkpoint_id}-a{attempt}.parquet"
        (self.table / relative).parent.mkdir(parents=True, exist_ok=True)
        rows = pa.table({"k": [f"c{checkpoint_id}-a", f"c{checkpoint_id}-b"], "v": pa.array([1, 2], pa.int64())})
        pq.write_table(rows, self.table / relative)
        return {"path": relative, "size": (self.table / relative).stat().st_size, "num_records": 2}

    def trigger(self, run: int) -> tuple[CheckpointPlan, list[Ack | None]]:
        (self.landing / f"e{run}.json").write_text('{"k": "x", "v": 1}\n')
        plan = self.coordinator.trigger(f"run-{run}")
        cid = plan.checkpoint_id
        self.staged(cid, 1)  # the attempt that died after staging: its file is a leftover
        add = {**self.staged(cid, 2), "partition_values": {}}
        sinks = {SINK: [{"checkpoint_id": cid, "adds": [add], "removes": []}]}
        ack = Ack(JOB, cid, STEP, 2, sinks=sinks, attempt_dir=JobStorage.attempt_dir(cid, STEP, 2))
        return plan, [ack]

    def checkpoint(self, run: int) -> CompletedCheckpoint:
        return self.coordinator.finalize(*self.trigger(run))

    def leftovers(self) -> list[str]:
        return sorted(p.name for p in self.table.glob("chk-*/*/*/attempt-1/*.parquet"))

    def rows(self) -> list[str]:
        """The table's keys as delta-rs reads it, sorted (a checkpoint's rows twice would show)."""
        from deltalake import DeltaTable

        return sorted(DeltaTable(str(self.table)).to_pyarrow_table()["k"].to_pylist())

    def commits(self) -> Counter[int]:
        """Checkpoint id → how many Delta commits carry its ``txn``."""
        counts: Counter[int] = Counter()
        for entry in (self.table / "_delta_log").glob("*.json"):
            for line in entry.read_text().splitlines():
                counts.update([json.loads(line)["txn"]["version"]] if "txn" in line else [])
        return counts

    def log_checkpoint(self, version: int) -> bool:
        return (self.table / "_delta_log" / f"{version:020d}.checkpoint.parquet").exists()

    def due(self) -> dict[str, list[int]]:
        """What the job record keeps to run again."""
        due: dict[str, list[int]] = json.loads(self.storage.read_bytes("_job.json")).get("housekeeping", {})
        return due

    def status(self, checkpoint_id: int) -> str:
        return str(json.loads(self.storage.read_bytes(self.storage.stats_path(checkpoint_id)))["status"])


def rows_of(*checkpoint_ids: int) -> list[str]:
    return sorted(f"c{c}-{k}" for c in checkpoint_ids for k in "ab")


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize(
    "fault",
    [
        f"storage.write:file={1:020d}.checkpoint.parquet:action=oserror",
        "storage.write:file=_last_checkpoint:action=oserror",
        "storage.delete:file=part-c1-a1.parquet:action=oserror",
    ],
    ids=["log checkpoint", "log checkpoint hint", "leftover delete"],
)
def test_a_failed_housekeeping_completes_the_checkpoint_and_the_next_one_does_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, fault: str
) -> None:
    lake = Lake(tmp_path)
    monkeypatch.setenv(FAULTS, fault)
    with caplog.at_level(logging.WARNING):
        assert lake.checkpoint(1).checkpoint_id == 1
    (line,) = warnings(caplog)
    assert line.startswith(f"sink {SINK}: housekeeping after the commit of checkpoint 1 failed") and "OSError" in line
    assert lake.status(1) == "COMPLETED" and lake.rows() == rows_of(1) and lake.commits() == {1: 1}
    assert lake.leftovers() == ["part-c1-a1.parquet"] and lake.due() == {SINK: [1]}
    assert lake.log_checkpoint(1) is ("checkpoint.parquet" not in fault)

    monkeypatch.delenv(FAULTS)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        lake.checkpoint(2)
    assert warnings(caplog) == []
    assert lake.rows() == rows_of(1, 2) and lake.commits() == {1: 1, 2: 1}, "no row lost, none twice"
    assert lake.leftovers() == [] and lake.due() == {}, "checkpoint 1's leftover deleted after checkpoint 2's commit"
    hint = json.loads((lake.table / "_delta_log" / "_last_checkpoint").read_text())
    assert lake.log_checkpoint(2) and hint["version"] == 2, "the log checkpointed whole at the next commit"
    assert audit_job(lake.storage, 3, [lake.sink]) == []


def test_housekeeping_failing_again_stays_due_and_the_first_to_succeed_does_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every leftover delete failing for two checkpoints: each checkpoint completes, both stay due (the retry
    of the first failing too, one warning each), then one finalize deletes both."""
    lake = Lake(tmp_path)
    monkeypatch.setenv(FAULTS, ",".join(f"storage.delete:file=part-c{c}-a1.parquet:action=oserror" for c in (1, 2)))
    with caplog.at_level(logging.WARNING):
        lake.checkpoint(1)
        lake.checkpoint(2)
    assert len(warnings(caplog)) == 3 and lake.due() == {SINK: [1, 2]}
    assert lake.status(2) == "COMPLETED" and lake.rows() == rows_of(1, 2)
    assert lake.leftovers() == ["part-c1-a1.parquet", "part-c2-a1.parquet"]
    monkeypatch.delenv(FAULTS)
    lake.checkpoint(3)
    assert lake.leftovers() == [] and lake.due() == {} and lake.rows() == rows_of(1, 2, 3)
    assert lake.commits() == {1: 1, 2: 1, 3: 1} and audit_job(lake.storage, 3, [lake.sink]) == []


def test_a_finalize_that_died_after_the_commit_is_retried_with_its_housekeeping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The finalize fails between the Delta commit and its housekeeping: its retry commits nothing again
    (the table has the checkpoint) and deletes the leftover the first run left."""
    lake = Lake(tmp_path)
    plan, acks = lake.trigger(1)
    monkeypatch.setenv(FAULTS, f"finalize.between_sink_commits:checkpoint=1:sink={SINK}")
    with pytest.raises(InjectedFault):
        lake.coordinator.finalize(plan, acks)
    assert lake.rows() == rows_of(1) and lake.leftovers() == ["part-c1-a1.parquet"]
    monkeypatch.delenv(FAULTS)
    lake.coordinator.finalize(plan, acks)
    assert lake.rows() == rows_of(1) and lake.commits() == {1: 1} and lake.leftovers() == []
    assert lake.status(1) == "COMPLETED" and audit_job(lake.storage, 3, [lake.sink]) == []


def test_a_sink_the_pipeline_no_longer_has_is_no_longer_due(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    sinks = committer.SinkCommitter([lake.sink], JOB)
    assert sinks.catch_up({"gone": [1, 2]}) == {}
