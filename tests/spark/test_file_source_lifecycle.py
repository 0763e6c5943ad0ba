"""A FileSource with a backlog split over checkpoints and clean_source=archive, on real Spark.

Checkpoints are driven as the operators drive them (trigger → run_step → finalize), with
a crash between the commit point and archiving; the tables must equal pandas over all
input, every file must be archived once, and the position must not grow.
"""

from __future__ import annotations

import pandas as pd
import pytest

from airflow_provider_checkpoint.coordinator import CheckpointCoordinator
from airflow_provider_checkpoint.core.settings import CheckpointSettings
from airflow_provider_checkpoint.dataflow import FileSource, KeyedAggregate, ParquetTableSink, PipelineGraph
from airflow_provider_checkpoint.exceptions import InjectedFault
from airflow_provider_checkpoint.spark.runner import run_step
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore
from airflow_provider_checkpoint.testing.clickstream import expected_tables, land_events, normalized, read_table


def test_backlog_and_archiving_with_a_crash_between_commit_and_archiving(spark, tmp_path, monkeypatch):
    landing, archive, marts = tmp_path / "landing", tmp_path / "archive", tmp_path / "marts"
    landed = [land_events(landing, f"events-{i}.json", 40 + i, seed=i) for i in range(1, 4)]
    events = FileSource(
        "events",
        str(landing),
        "json",
        "user STRING, page STRING, ts LONG",
        max_files_per_checkpoint=2,
        clean_source="archive",
        archive_dir=str(archive),
    )
    totals = KeyedAggregate(
        "user_totals", events, keys=["user"], aggs={"events": "count", "first_seen": "min(ts)", "last_seen": "max(ts)"}
    )
    sinks = [
        ParquetTableSink("user_totals_table", totals, str(marts / "user_totals"), "upsert", ["user"], step="main"),
        ParquetTableSink("events_table", events, str(marts / "events"), "append", step="main"),
    ]
    graph = PipelineGraph([events, totals, *sinks])
    storage = JobStorage.for_job(str(tmp_path / "checkpoints"), "job")
    coordinator = CheckpointCoordinator(storage, graph, CheckpointSettings(retained_checkpoints=2))

    files_per_checkpoint = []
    for checkpoint in (1, 2):
        plan = coordinator.trigger(f"run-{checkpoint}")
        acks = [run_step(spark, storage, graph, step, plan, 1) for step in plan.steps]
        if checkpoint == 1:
            monkeypatch.setenv("CHECKPOINT_FAULTS", "finalize.before_clean_source:checkpoint=1")
            with pytest.raises(InjectedFault):
                coordinator.finalize(plan, acks)
            monkeypatch.delenv("CHECKPOINT_FAULTS")
            assert len(list(landing.glob("*.json"))) == 3, "nothing archived before the crash point"
            assert CompletedCheckpointStore(storage).is_completed(1), "committed"
        else:
            coordinator.finalize(plan, acks)
        files_per_checkpoint.append(acks[0].metrics["files_in"])
        position = CompletedCheckpointStore(storage).load(checkpoint).source_positions["events"]
        assert len(position["files"]) <= 2, "the position holds the files of one checkpoint at most"

    assert files_per_checkpoint == [2, 1]
    assert not list(landing.glob("*.json"))
    assert sorted(p.name for p in archive.glob("*.json")) == [f"events-{i}.json" for i in range(1, 4)]
    truth = expected_tables(pd.concat(landed))
    for table in ("user_totals", "events"):
        got = normalized(read_table(marts / table), table)
        pd.testing.assert_frame_equal(got, normalized(truth[table], table))


@pytest.mark.parametrize("merge_rows", [1_000_000, 0], ids=["driver-merge", "spark-merge"])
@pytest.mark.parametrize("engine", ["hadoop", "python"])
def test_files_holding_no_record_checkpoint_as_zero_records(spark, tmp_path, engine, merge_rows):
    """Empty files and files of blank lines are read and counted as zero records, before and after state
    exists (Spark records no observed metrics when no row passes: the count is then a job of its own)."""
    landing = tmp_path / "landing"
    events = FileSource("events", str(landing), "json", "user STRING, page STRING, ts LONG")
    views = KeyedAggregate("page_views", events, keys=["page"], aggs={"views": "count"})
    sink = ParquetTableSink("views_table", views, str(tmp_path / "views"), "upsert", ["page"])
    graph = PipelineGraph([events, views, sink])
    storage = JobStorage.for_job(str(tmp_path / "checkpoints"), "job")
    settings = CheckpointSettings(driver_merge_rows=merge_rows, inline_state_threshold=0)
    coordinator = CheckpointCoordinator(storage, graph, settings)
    landing.mkdir()
    one, two = '{"user":"a","page":"p","ts":1}\n', '{"user":"b","page":"q","ts":2}\n{"user":"c","page":"p","ts":3}\n'
    spark.conf.set("spark.checkpoint.fileEngine", engine)
    try:
        for i, text in enumerate(["", "\n\n", one, "", "\n", two], 1):
            (landing / f"events-{i}.json").write_text(text)
            plan = coordinator.trigger(f"run-{i}")
            (ack,) = [run_step(spark, storage, graph, step, plan, 1) for step in plan.steps]
            coordinator.finalize(plan, [ack])
            assert ack.metrics["records_in"] == text.count("user"), f"checkpoint {i}"
    finally:
        spark.conf.unset("spark.checkpoint.fileEngine")
    got = read_table(tmp_path / "views").sort_values("page").reset_index(drop=True)
    assert got.to_dict("records") == [{"page": "p", "views": 2}, {"page": "q", "views": 1}]
