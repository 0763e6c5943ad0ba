"""A job's first checkpoint writes its aggregate's state by key-group range in the pass that computes it
(or, from a small input, on the driver).

The number of ranges comes from Spark's estimate of the input's rows; with many events per key the
estimate is far above the state's rows, and the files are grouped into the ranges the state's size
wants. Checked against pandas: the state (read with pyarrow alone, and with Spark), the table (read
with pyarrow), and the checkpoints after it, which continue those ranges incrementally (on the driver
and with Spark jobs) and compact them.
"""

from __future__ import annotations

import random
from pathlib import Path

import pandas as pd
import pytest

from airflow_provider_checkpoint.dataflow import FileSource, KeyedAggregate, ParquetTableSink
from airflow_provider_checkpoint.jobs.audit import audit_job
from airflow_provider_checkpoint.restore.requests import read_state, request_restore
from airflow_provider_checkpoint.state import checkpointing, incremental
from airflow_provider_checkpoint.state.incremental import StateLayout, ranges_for
from airflow_provider_checkpoint.testing.clickstream import land_json_lines, read_table
from airflow_provider_checkpoint.testing.inprocess import make_job

pytestmark = pytest.mark.spark

AGGS = {"n": "count", "total": "sum(amount)", "top": "max(amount)", "first": "min(ts)", "priced": "count(amount)"}


def declare(base: Path) -> None:
    events = FileSource("events", f"{base}/landing", "json", "user STRING, ts LONG, amount LONG")
    totals = KeyedAggregate("totals", events, keys=["user"], aggs=AGGS)
    ParquetTableSink("totals_table", totals, f"{base}/totals", mode="upsert", keys=["user"])


def land(base: Path, rng: random.Random, name: str, n: int, users: int) -> pd.DataFrame:
    """``n`` events over ``users`` keys, a null and an empty user among them, some amounts null."""
    names = [None, "", *[f"u{i}" for i in range(users - 2)]]
    rows = [
        {"user": rng.choice(names), "ts": rng.randrange(10**9), "amount": rng.choice([None, *range(1, 50)])}
        for _ in range(n)
    ]
    land_json_lines(base / "landing", name, rows)
    return pd.DataFrame(rows)


def truth(events: pd.DataFrame) -> pd.DataFrame:
    by = events.assign(user=events["user"].fillna("<null>")).groupby("user", dropna=False)
    out = by.agg(
        n=("ts", "size"),
        total=("amount", "sum"),
        top=("amount", "max"),
        first=("ts", "min"),
        priced=("amount", "count"),
    ).reset_index()
    return normal(out.assign(user=out["user"].replace("<null>", None)))


def normal(df: pd.DataFrame) -> pd.DataFrame:
    df = df[["user", *AGGS]].astype({c: "float64" for c in AGGS})  # nulls in top: compare as floats
    return df.assign(user=df["user"].fillna("<null>")).sort_values("user").reset_index(drop=True)


@pytest.mark.parametrize("first", ["spark", "driver"])
def test_first_state_is_written_by_range_and_continued(spark, tmp_path, monkeypatch, first: str) -> None:
    """The first state written by Spark, or merged on the driver from no state (a small input); its grouped
    ranges are continued on the driver (checkpoint 2: at most 45 rows of state), then by Spark jobs
    (checkpoint 3, above 45 rows), then written in full (checkpoint 4: most keys change)."""
    monkeypatch.setattr(incremental, "RANGE_ROWS", 12)  # ~40 keys want 4 ranges; the estimate wants 128
    if first == "spark":
        monkeypatch.setattr(checkpointing, "first_version_on_driver", lambda *args: None)
    rng = random.Random(11)
    job = make_job(spark, tmp_path, declare, inline_state_threshold=0, driver_merge_rows=45)
    landed = [land(tmp_path, rng, "e1.json", 3000, 42)]
    completed = job.checkpoint()
    snapshot = completed.operators["totals"]
    layout = StateLayout.of(snapshot)
    assert layout is not None and snapshot.rows == 42
    assert layout.parallelism == ranges_for(42, 128) == 4  # grouped into the ranges 42 rows want
    assert len(snapshot.handles) > layout.parallelism  # written one file per estimated range
    assert [s["state_rows"] for s in completed.stats["steps"].values()] == [42]
    on_driver = any(m.get("state_merged_on_driver") for m in completed.stats["steps"].values())
    assert on_driver is (first == "driver"), completed.stats["steps"]
    savepoint = f"file://{tmp_path}/savepoints/sp-2"
    for cid, (events, users) in enumerate([(0, 0), (30, 50), (40, 60), (2000, 60), (5, 60)], start=1):
        if cid > 1:
            landed.append(land(tmp_path, rng, f"e{cid}.json", events, users))
            completed = job.checkpoint(savepoint_target=savepoint if cid == 2 else None)
            on_driver = any(m.get("state_merged_on_driver") for m in completed.stats["steps"].values())
            assert on_driver is (cid == 2), (cid, completed.stats["steps"])
        want = truth(pd.concat(landed))
        pointer = job.storage.url(job.storage.chk_dir(completed.checkpoint_id))
        pd.testing.assert_frame_equal(normal(read_state(pointer, "totals").to_pandas()), want)
        pd.testing.assert_frame_equal(normal(read_table(tmp_path / "totals")), want)
        assert audit_job(job.storage, 10, job.graph.sinks) == []
    pd.testing.assert_frame_equal(normal(read_state(pointer, "totals", spark=spark).toPandas()), want)
    # back to the savepoint of checkpoint 2 (checkpoint 1's grouped files, then a delta): the files the
    # savepoint's position has not processed are read again, once
    request_restore(job.storage, savepoint, False, False)
    more = land(tmp_path, rng, "e6.json", 50, 60)
    completed = job.checkpoint()
    pointer = job.storage.url(job.storage.chk_dir(completed.checkpoint_id))
    want = truth(pd.concat([*landed, more]))
    pd.testing.assert_frame_equal(normal(read_state(pointer, "totals").to_pandas()), want)
    assert audit_job(job.storage, 10, job.graph.sinks) == []
