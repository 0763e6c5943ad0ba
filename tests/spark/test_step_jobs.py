"""How many Spark jobs a checkpoint's step runs, pinned: a redundant pass fails this test.

The counts are those of today's step (adaptive query execution runs each shuffle stage as a
job of its own); lower them here when a pass goes away. The table is checked against pandas
so that fewer jobs never means less work done.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql import DataFrame

from airflow_provider_checkpoint.dataflow import FileSource, KeyedAggregate, ParquetTableSink
from airflow_provider_checkpoint.exceptions import MalformedInputError
from airflow_provider_checkpoint.state import driver_merge as driver_state
from airflow_provider_checkpoint.storage.job_records import JobRecordStore
from airflow_provider_checkpoint.testing.clickstream import land_events, read_table
from airflow_provider_checkpoint.testing.inprocess import make_job

pytestmark = pytest.mark.spark

FIRST_JOBS = {"driver": 0, "large input": 3}
"""The first checkpoint. ``driver`` (a small input): the driver reads the JSON lines (Spark's rows exactly,
:mod:`~airflow_provider_checkpoint.connectors.files.json_driver`), aggregates them, writes the state, and the upsert
takes the rows from the driver: no job. ``large input``: read the input and aggregate it by key-group range (the
shuffle stage runs as a job of its own), each task writing its range's file, then the upsert collects those rows back
from the files (a small first load, merged in the driver)."""
INCREMENTAL_JOBS = {"driver": 0, "large input": 5}
"""A later checkpoint. ``driver`` (a small state, merged with pyarrow): the driver reads and aggregates the input
too; the upsert takes the merged rows from the driver: no job, and no DataFrame made of them (no rows handed to
the JVM). ``large input`` (Spark): read the input
with the state, cache the changelog, write a delta (or, when most keys changed, count them and
write a full version), upsert the table."""
SWITCH_JOBS = {"driver": 0, "large input": 6}
"""Where few changed keys turn into most: a delta as large as the state, then the compaction of
every range it makes due. ``driver``: the driver merges and compacts them (no more jobs than an
increment); ``large input``: a full version, the state read with its deltas merged by Spark."""


def declare(base: Path) -> None:
    schema = "user STRING, page STRING, ts LONG, amount LONG"  # amount: declared, unused downstream
    events = FileSource("events", f"{base}/landing", "json", schema)
    totals = KeyedAggregate("totals", events, keys=["user"], aggs={"n": "count", "last": "max(ts)"})
    ParquetTableSink("totals_table", totals, f"{base}/totals", mode="upsert", keys=["user"])


@pytest.mark.parametrize("merge", ["driver", "large input"])
def test_a_checkpoint_runs_a_pinned_number_of_spark_jobs(spark, tmp_path: Path, merge: str, monkeypatch) -> None:
    """``large input``: a small state, but an input above the driver's bound merges with Spark jobs
    (as ``driver_merge_rows=0`` does)."""
    if merge == "large input":
        monkeypatch.setattr(driver_state, "DRIVER_INPUT_BYTES", 1000)
        monkeypatch.setattr(driver_state, "FIRST_STATE_INPUT_BYTES", 1000)
    job = make_job(spark, tmp_path, declare, inline_state_threshold=0)
    tracker = spark.sparkContext.statusTracker()
    sent: list[int] = []  # rows of every Arrow table handed to the JVM (createDataFrame)
    create = spark.createDataFrame

    def counted(data: object, *args: object, **kwargs: object) -> object:
        if isinstance(data, pa.Table):
            sent.append(data.num_rows)
        return create(data, *args, **kwargs)

    monkeypatch.setattr(spark, "createDataFrame", counted)
    planned: list[str] = []  # operators whose partials Spark planned
    partials = KeyedAggregate.partials

    def spied(self: KeyedAggregate, inputs: dict[str, DataFrame]) -> DataFrame | None:
        planned.append(self.uid)
        return partials(self, inputs)

    monkeypatch.setattr(KeyedAggregate, "partials", spied)
    landed: list[pd.DataFrame] = []
    jobs: list[int] = []
    deltas: list[bool] = []
    for i, (events, users) in enumerate(
        [(4000, 800), (200, 800), (200, 800), (8000, 800), (8000, 800), (8000, 800)], start=1
    ):
        landed.append(land_events(tmp_path / "landing", f"events-{i}.json", events, seed=i, users=users))
        before = set(tracker.getJobIdsForGroup())
        completed = job.checkpoint()
        jobs.append(len(set(tracker.getJobIdsForGroup()) - before))
        deltas.append(any(h.delta is not None for h in completed.operators["totals"].handles))
        on_driver = any(m.get("state_merged_on_driver") for m in completed.stats["steps"].values())
        assert on_driver is (merge == "driver" and i in (1, 2, 3, 4, 5, 6)), (i, completed.stats["steps"])
        truth = pd.concat(landed).groupby("user").agg(n=("ts", "size"), last=("ts", "max")).reset_index()
        got = read_table(tmp_path / "totals").sort_values("user").reset_index(drop=True)
        pd.testing.assert_frame_equal(got[["user", "n", "last"]], truth, check_dtype=False)
    print("jobs per checkpoint", jobs, "deltas", deltas)
    # the merged rows go from the driver to the upsert: their DataFrame (a LazyFrame) is never made
    assert merge != "driver" or not any(sent), sent
    assert merge != "driver" or not planned, planned  # the driver reduced the rows it read: no Spark plan of them
    assert jobs[0] <= FIRST_JOBS[merge], jobs
    assert max(jobs[1], jobs[2], jobs[5]) <= INCREMENTAL_JOBS[merge], jobs
    assert max(jobs[3], jobs[4]) <= SWITCH_JOBS[merge], jobs
    # few keys change: deltas; then most keys (8,000 events over 800 users): one more delta
    # (its restore point had deltas), the compaction it makes due, then full versions
    assert deltas == [False, True, True, True, False, False], deltas


@pytest.mark.parametrize("driver_merge_rows", [1_000_000, 10])
def test_a_first_state_is_written_by_the_driver_while_its_rows_are_estimated_within_bound(
    spark, tmp_path: Path, monkeypatch, driver_merge_rows: int
) -> None:
    """The driver collects and writes a first state from an input above the bound of a later merge's partials
    (``DRIVER_INPUT_BYTES``, lowered here) while Spark estimates the state at most ``driver_merge_rows`` rows;
    above that, Spark writes it. The table equals pandas either way."""
    monkeypatch.setattr(driver_state, "DRIVER_INPUT_BYTES", 1000)
    job = make_job(spark, tmp_path, declare, inline_state_threshold=0, driver_merge_rows=driver_merge_rows)
    landed = land_events(tmp_path / "landing", "events-1.json", 4000, seed=1, users=800)
    completed = job.checkpoint()
    on_driver = any(m.get("state_merged_on_driver") for m in completed.stats["steps"].values())
    assert on_driver is (driver_merge_rows == 1_000_000), completed.stats["steps"]
    truth = landed.groupby("user").agg(n=("ts", "size"), last=("ts", "max")).reset_index()
    got = read_table(tmp_path / "totals").sort_values("user").reset_index(drop=True)
    pd.testing.assert_frame_equal(got[["user", "n", "last"]], truth, check_dtype=False)


def test_one_pass_read_counts_and_refuses_malformed_records_before_the_ack(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A source feeding only a keyed aggregate is read once, uncached: its count and its
    malformed-record check come from that pass, and a bad record still fails the step before
    anything is committed — also in a declared column the pipeline does not use. The step lists the landing
    directory once, also where the driver's read of the lines declines (a bad line) and Spark reads them."""
    listings: list[str] = []  # the step's listings of the landing directory (its files checked unchanged)
    check_unchanged = FileSource.check_unchanged

    def listed(self: FileSource, todo: dict[str, int], barrier: object) -> None:
        listings.append(self.uid)
        check_unchanged(self, todo, barrier)

    monkeypatch.setattr(FileSource, "check_unchanged", listed)
    job = make_job(spark, tmp_path, declare, inline_state_threshold=0)
    landing = tmp_path / "landing"
    good = land_events(landing, "events-1.json", 300, seed=1)
    assert job.checkpoint().stats["records_in"] == 300
    assert listings == ["events"], listings
    for name, line in (
        ("broken.json", '{"user": "u1", "page"\n'),
        ("typed.json", '{"user": "u2", "ts": 5, "amount": "lots"}\n'),
    ):
        (landing / name).write_text('{"user": "u9", "page": "/p", "ts": 1}\n' + line)
        listings.clear()
        with pytest.raises(MalformedInputError, match=rf"{name.replace('.', r'[.]')} line 2"):
            job.checkpoint()
        assert listings == ["events"], listings  # the driver's read declined, Spark's read lists no more
        JobRecordStore(job.storage).release_lease(f"run-{job.checkpoints}")  # as the failed run's finalize does
        (landing / name).unlink()
        got = read_table(tmp_path / "totals").sort_values("user").reset_index(drop=True)
        truth = good.groupby("user").agg(n=("ts", "size"), last=("ts", "max")).reset_index()
        pd.testing.assert_frame_equal(got[["user", "n", "last"]], truth, check_dtype=False)
    more = land_events(landing, "events-2.json", 50, seed=2)
    assert job.checkpoint().stats["records_in"] == 50
    truth = pd.concat([good, more]).groupby("user").agg(n=("ts", "size"), last=("ts", "max")).reset_index()
    got = read_table(tmp_path / "totals").sort_values("user").reset_index(drop=True)
    pd.testing.assert_frame_equal(got[["user", "n", "last"]], truth, check_dtype=False)
