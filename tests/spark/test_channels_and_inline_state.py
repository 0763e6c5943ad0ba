"""Channels between steps (region failover, alignment, discard) and inline / memory-backed state.

Checkpoints run in-process through the real protocol (coordinator, Spark steps, finalize);
tables are compared with pandas over all input.
"""

from __future__ import annotations

import random
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from airflow_provider_checkpoint.dataflow import Channel, FileSource, KeyedAggregate, ParquetTableSink, Transform
from airflow_provider_checkpoint.exceptions import CheckpointAborted, StateTooLargeError
from airflow_provider_checkpoint.restore.requests import read_state, request_restore
from airflow_provider_checkpoint.spark.runner import run_step
from airflow_provider_checkpoint.state.savepoints import write_savepoint
from airflow_provider_checkpoint.storage import Location
from airflow_provider_checkpoint.testing.inprocess import make_job
from tests.spark.helpers import table, write_json

pytestmark = pytest.mark.spark
EVENTS = "user STRING, amount LONG"


def land(tmp: Path, n: int, rows: int, users: int = 20) -> pd.DataFrame:
    rng = random.Random(n)
    data = [{"user": f"u{rng.randrange(users)}", "amount": rng.randrange(1, 100)} for _ in range(rows)]
    write_json(tmp / "landing" / f"e{n}.json", data)
    return pd.DataFrame(data)


def totals(events: pd.DataFrame) -> pd.DataFrame:
    return events.groupby("user").agg(total=("amount", "sum"), n=("amount", "size")).reset_index()


def channel_pipeline(tmp: Path) -> None:
    events = FileSource("events", str(tmp / "landing"), "json", EVENTS)
    doubled = Transform("doubled", events, lambda df: df.withColumn("amount", df.amount * 2))
    cleaned = Channel("cleaned", doubled, step="prepare")
    per_user = KeyedAggregate("per_user", cleaned, ["user"], {"total": "sum(amount)", "n": "count"})
    ParquetTableSink("totals", per_user, str(tmp / "marts" / "totals"), mode="upsert", keys=["user"], step="publish")
    ParquetTableSink("archive", cleaned, str(tmp / "marts" / "archive"), mode="append", step="publish")


def test_channel_between_steps_with_region_failover(spark, tmp_path, monkeypatch):
    job = make_job(spark, tmp_path, channel_pipeline)
    assert list(job.graph.steps) == ["step_prepare", "step_publish"]
    assert job.graph.upstream_steps("step_publish") == ["step_prepare"]
    landed = [land(tmp_path, 1, 300)]
    job.checkpoint()
    landed.append(land(tmp_path, 2, 200))
    # the downstream step fails once after staging: only it is retried, and it reads the same channel
    monkeypatch.setenv("CHECKPOINT_FAULTS", "step.before_ack:checkpoint=2:step=step_publish:attempt=1")
    completed = job.checkpoint()
    assert [r for r in job.step_runs if r[0] == 2] == [
        (2, "step_prepare", 1),
        (2, "step_publish", 1),
        (2, "step_publish", 2),
    ]
    assert completed.stats["channel_rows"] == 200 and completed.stats["channel_bytes"] > 0
    steps, sinks = completed.stats["steps"], completed.stats["sinks"]
    assert (steps["step_prepare"]["attempt"], steps["step_publish"]["attempt"]) == (1, 2)
    assert steps["step_prepare"]["input_records"] == {"events": 200} and steps["step_prepare"]["records_out"] == 200
    assert steps["step_publish"]["input_records"] == {"cleaned": 200}, "a channel's records, per input"
    assert {uid: (s["step"], s["rows"]) for uid, s in sinks.items()} == {
        "archive": ("step_publish", 200),
        "totals": ("step_publish", landed[1].user.nunique()),  # the users whose total changed
    }
    assert steps["step_publish"]["records_out"] == 200 + landed[1].user.nunique()
    assert type(steps["step_publish"]["state_incremental"]) is bool and "state_incremental" not in steps["step_prepare"]
    assert not list((tmp_path / "ckpt" / "multi").glob("chk-*/*/attempt-*/channels")), "channels are discarded"

    events = pd.concat(landed).assign(amount=lambda d: d.amount * 2)
    got = table(tmp_path / "marts" / "totals").sort_values("user").reset_index(drop=True)
    pd.testing.assert_frame_equal(got[["user", "total", "n"]], totals(events), check_dtype=False)
    archive = table(tmp_path / "marts" / "archive").sort_values(["user", "amount"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(
        archive[["user", "amount"]], events.sort_values(["user", "amount"]).reset_index(drop=True), check_dtype=False
    )


def test_a_step_that_read_a_stale_channel_is_declined(spark, tmp_path):
    job = make_job(spark, tmp_path, channel_pipeline)
    land(tmp_path, 1, 50)
    plan = job.coordinator.trigger("run-1", now=1.0)
    first = run_step(spark, job.storage, job.graph, "step_prepare", plan, 1)
    second = run_step(spark, job.storage, job.graph, "step_prepare", plan, 2)  # e.g. a cleared, re-run task
    channel = {"cleaned": (first.attempt_dir, first.channels["cleaned"])}
    downstream = run_step(spark, job.storage, job.graph, "step_publish", plan, 1, channel)
    with pytest.raises(CheckpointAborted, match="read channel cleaned of chk-1/step_prepare/attempt-1"):
        job.coordinator.finalize(plan, [first, second, downstream], now=2.0)
    assert table(tmp_path / "marts" / "totals").empty


def aggregate_pipeline(tmp: Path) -> None:
    events = FileSource("events", str(tmp / "landing"), "json", EVENTS)
    per_user = KeyedAggregate("per_user", events, ["user"], {"total": "sum(amount)", "n": "count"})
    ParquetTableSink("totals", per_user, str(tmp / "marts" / "totals"), mode="upsert", keys=["user"])


def test_memory_storage_keeps_state_inline_savepoints_stay_canonical(spark, tmp_path):
    job = make_job(spark, tmp_path, aggregate_pipeline, checkpoint_storage="memory", max_state_size=64 << 10)
    landed = [land(tmp_path, 1, 400), land(tmp_path, 2, 100)]
    first = job.checkpoint()
    state = first.operators["per_user"]
    assert state.inline is not None and not state.handles and state.rows == 20
    assert not list((tmp_path / "ckpt" / "multi").rglob("*.parquet")), "memory storage writes no state files"
    got = read_state(job.storage.url("chk-1"), "per_user").to_pandas().sort_values("user").reset_index(drop=True)
    pd.testing.assert_frame_equal(got[["user", "total", "n"]], totals(pd.concat(landed)), check_dtype=False)

    target = Location.from_url(f"file://{tmp_path}/savepoints/sp-1")
    savepoint = write_savepoint(job.storage, first, target)
    (handle,) = savepoint.operators["per_user"].handles
    assert savepoint.operators["per_user"].inline is None
    plain = pq.read_table(tmp_path / "savepoints" / "sp-1" / handle.path).to_pandas()  # pyarrow alone
    pd.testing.assert_frame_equal(
        plain.sort_values("user").reset_index(drop=True)[["user", "total", "n"]], got[["user", "total", "n"]]
    )

    landed.append(land(tmp_path, 3, 150))
    job.checkpoint()
    request_restore(job.storage, target.url(), False, False)  # back to the savepoint; checkpoint 3 replays e3
    job.checkpoint()
    final = table(tmp_path / "marts" / "totals").sort_values("user").reset_index(drop=True)
    pd.testing.assert_frame_equal(final[["user", "total", "n"]], totals(pd.concat(landed)), check_dtype=False)


def test_state_over_the_memory_limit_is_declined_and_the_threshold_is_respected(spark, tmp_path):
    job = make_job(spark, tmp_path, aggregate_pipeline, checkpoint_storage="memory", max_state_size=2048)
    land(tmp_path, 1, 2000, users=1500)
    with pytest.raises(StateTooLargeError, match=r"operator per_user: its state .* exceeds max_state_size=2048"):
        job.checkpoint()

    files = make_job(spark, tmp_path / "fs", aggregate_pipeline, inline_state_threshold=2048)
    land(tmp_path / "fs", 1, 30, users=5)
    small = files.checkpoint().operators["per_user"]
    assert small.inline is not None and small.inline.size <= 2048
    land(tmp_path / "fs", 2, 2000, users=1500)
    big = files.checkpoint().operators["per_user"]
    assert big.inline is None and big.handles and big.size > 2048
