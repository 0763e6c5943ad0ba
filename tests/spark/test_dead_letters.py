"""Dead letters over several checkpoints: the dead-letter tables equal the malformed lines of the
landed files by Python's own parse, the outputs equal pandas over the good lines, exactly once."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from airflow_provider_checkpoint.dataflow import FileSource, KeyedAggregate, ParquetTableSink
from airflow_provider_checkpoint.dataflow.defaults import SourceDefaults
from airflow_provider_checkpoint.exceptions import MalformedInputError, TooManyMalformedError
from airflow_provider_checkpoint.testing.clickstream import read_table
from airflow_provider_checkpoint.testing.inprocess import make_job
from airflow_provider_checkpoint.testing.malformed import (
    DEAD_LETTER_KEY,
    SCHEMA,
    ground_truth,
    land_mixed,
    sorted_frame,
)

pytestmark = pytest.mark.spark


def declare(base: Path) -> None:
    # json: its own setting, read in one pass by the aggregate; csv: the pipeline's, read cached
    clicks = FileSource("clicks", f"{base}/json", "json", SCHEMA, on_malformed="dead_letter")
    totals = KeyedAggregate("totals", clicks, keys=["user"], aggs={"n": "count", "last": "max(ts)"})
    ParquetTableSink("totals_table", totals, f"{base}/totals", mode="upsert", keys=["user"])
    orders = FileSource("orders", f"{base}/csv", "csv", SCHEMA, dead_letter_path=f"{base}/orders_dead")
    ParquetTableSink("orders_table", orders, f"{base}/orders", mode="append")


def test_dead_letters_equal_the_malformed_lines_exactly_once(spark, tmp_path: Path, monkeypatch) -> None:
    defaults = SourceDefaults(on_malformed="dead_letter", dead_letter_path=f"{tmp_path}/dead")
    job = make_job(spark, tmp_path, declare, defaults)
    landed: dict[str, dict[int, list[str]]] = {"json": {}, "csv": {}}
    for checkpoint_id in range(1, 4):
        for format, extension in (("json", "json"), ("csv", "csv")):
            names = [f"{format}-{checkpoint_id}-{i}.{extension}" for i in range(2)]
            for i, name in enumerate(names):
                land_mixed(tmp_path / format, name, format, 40 + 13 * i, seed=10 * checkpoint_id + i)
            landed[format][checkpoint_id] = names
        if checkpoint_id == 2:  # both steps die before acking on their first attempt; the retry stages again
            monkeypatch.setenv("CHECKPOINT_FAULTS", "step.before_ack:checkpoint=2:attempt=1")
        else:
            monkeypatch.delenv("CHECKPOINT_FAULTS", raising=False)
        completed = job.checkpoint()

        good_json, dead_json = ground_truth("clicks", tmp_path / "json", "json", landed["json"])
        good_csv, dead_csv = ground_truth("orders", tmp_path / "csv", "csv", landed["csv"])
        clicks_dead, orders_dead = read_table(tmp_path / "dead" / "clicks"), read_table(tmp_path / "orders_dead")
        pd.testing.assert_frame_equal(
            sorted_frame(clicks_dead, DEAD_LETTER_KEY), sorted_frame(dead_json, DEAD_LETTER_KEY), check_dtype=False
        )
        pd.testing.assert_frame_equal(
            sorted_frame(orders_dead, DEAD_LETTER_KEY), sorted_frame(dead_csv, DEAD_LETTER_KEY), check_dtype=False
        )
        assert dead_json.duplicated(["file", "raw"]).any(), "a file repeats a malformed line"
        assert clicks_dead["error"].str.len().min() > 0 and orders_dead["error"].str.len().min() > 0
        truncated = clicks_dead[clicks_dead["raw"] == '{"user": "u1", "page"']
        assert truncated["error"].str.startswith("not valid JSON").all()
        columns = ["user", "page", "ts"]
        pd.testing.assert_frame_equal(
            sorted_frame(read_table(tmp_path / "orders"), columns), sorted_frame(good_csv, columns), check_dtype=False
        )
        totals = good_json.groupby("user").agg(n=("ts", "size"), last=("ts", "max")).reset_index()
        got = read_table(tmp_path / "totals").sort_values("user").reset_index(drop=True)
        pd.testing.assert_frame_equal(got[["user", "n", "last"]], totals, check_dtype=False)

        now = {
            uid: int((dead.checkpoint_id == checkpoint_id).sum())
            for uid, dead in (("clicks", dead_json), ("orders", dead_csv))
        }
        assert completed.stats["source_malformed"] == now
        assert completed.stats["malformed_records"] == sum(now.values())
        good_now = sum(
            len(ground_truth(uid, tmp_path / f, f, {checkpoint_id: landed[f][checkpoint_id]})[0])
            for uid, f in (("clicks", "json"), ("orders", "csv"))
        )
        assert completed.stats["records_in"] == good_now
    assert (2, "step_totals_table", 2) in job.step_runs, "the fault was injected and retried"
    assert not list(tmp_path.glob("**/_staging/chk-*")), "no staged dead letters left behind"


def test_a_mostly_malformed_checkpoint_is_declined_and_commits_nothing(spark, tmp_path: Path) -> None:
    def declare_threshold(base: Path) -> None:
        picky = FileSource("picky", f"{base}/json", "json", SCHEMA, max_malformed_fraction=0.2)
        ParquetTableSink("picky_table", picky, f"{base}/picky", mode="append")

    defaults = SourceDefaults(on_malformed="dead_letter", dead_letter_path=f"{tmp_path}/dead")
    job = make_job(spark, tmp_path, declare_threshold, defaults)
    land_mixed(tmp_path / "json", "ok.json", "json", 50, seed=1, malformed_every=10)  # 10%
    job.checkpoint()
    before = read_table(tmp_path / "dead" / "picky")
    assert len(before) == 5
    land_mixed(tmp_path / "json", "garbage.json", "json", 30, seed=2, malformed_every=3)  # 33%
    with pytest.raises(
        TooManyMalformedError,
        match=r"source picky: 10 of the 30 records .* \(33\.3%\), more than max_malformed_fraction 0\.2",
    ) as raised:
        job.checkpoint()
    assert "garbage.json line 3" in str(raised.value)
    pd.testing.assert_frame_equal(read_table(tmp_path / "dead" / "picky"), before)
    assert len(read_table(tmp_path / "picky")) == 45, "nothing of the declined checkpoint is visible"


def test_a_source_of_its_own_fails_on_a_malformed_record_under_a_dead_letter_pipeline(spark, tmp_path: Path) -> None:
    def declare_strict(base: Path) -> None:
        strict = FileSource("strict", f"{base}/csv", "csv", SCHEMA, on_malformed="fail")
        ParquetTableSink("strict_table", strict, f"{base}/strict", mode="append")

    job = make_job(spark, tmp_path, declare_strict, SourceDefaults(on_malformed="dead_letter"))
    land_mixed(tmp_path / "csv", "mixed.csv", "csv", 10, seed=3)
    with pytest.raises(MalformedInputError, match=r"mixed\.csv line 6"):
        job.checkpoint()
    assert [s.uid for s in job.graph.sinks] == ["strict_table"], "no dead-letter table for a failing source"


def test_dead_letters_cost_no_spark_job_until_a_record_is_malformed(spark, tmp_path: Path) -> None:
    """The one-pass read stays one pass: on clean input a dead-letter pipeline runs as many Spark
    jobs as a failing one; malformed records add the few jobs that read them again and stage them."""
    tracker = spark.sparkContext.statusTracker()
    jobs: dict[str, list[int]] = {}
    for mode in ("fail", "dead_letter"):

        def declare_mode(base: Path, mode: str = mode) -> None:
            clicks = FileSource("clicks", f"{base}/json", "json", SCHEMA, on_malformed=mode)
            totals = KeyedAggregate("totals", clicks, keys=["user"], aggs={"n": "count"})
            ParquetTableSink("totals_table", totals, f"{base}/totals", mode="upsert", keys=["user"])

        base = tmp_path / mode
        job = make_job(spark, base, declare_mode, SourceDefaults(dead_letter_path=f"{base}/dead"))
        jobs[mode] = []
        for i, every in enumerate((10**6, 10**6, 5)):  # clean, clean, then every fifth line malformed
            if mode == "fail" and every < 10**6:
                break
            land_mixed(base / "json", f"c-{i}.json", "json", 200, seed=i, malformed_every=every)
            before = set(tracker.getJobIdsForGroup())
            job.checkpoint()
            jobs[mode].append(len(set(tracker.getJobIdsForGroup()) - before))
    print("spark jobs per checkpoint", jobs)
    assert jobs["dead_letter"][:2] == jobs["fail"], jobs
    assert jobs["dead_letter"][2] <= jobs["fail"][1] + 2, jobs  # read the malformed again, stage them
