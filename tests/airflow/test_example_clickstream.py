"""The example pipeline through real Airflow (``dag.test()``) and real local Spark.

After every checkpoint the three tables must equal a ground truth computed with pandas
over all input landed so far: no loss, no duplicate, whatever fault was injected.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from airflow_provider_checkpoint.jobs.audit import audit_job
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.testing.clickstream import land_events, mismatches

pytestmark = pytest.mark.airflow


def assert_tables_match(base: Path, events: pd.DataFrame) -> None:
    assert mismatches(base / "marts", events) == {}


def test_five_checkpoints_exactly_once_with_step_retry_and_finalize_crash(example_dag, tmp_path, monkeypatch):
    dag = example_dag.dag
    base = tmp_path / "clickstream"
    job_dir = tmp_path / "checkpoints" / "example_clickstream"
    landed: list[pd.DataFrame] = []

    for increment in range(1, 6):
        landed.append(land_events(base / "landing", f"events-{increment}-a.json", 150, increment))
        landed.append(land_events(base / "landing", f"events-{increment}-b.json", 90, increment + 50))
        if increment == 2:  # the page-views step dies before acking on its first attempt
            monkeypatch.setenv("CHECKPOINT_FAULTS", "step.before_ack:checkpoint=2:attempt=1:step=step_page_views_table")
        elif increment == 4:  # finalize dies right after the commit point, on every attempt
            monkeypatch.setenv("CHECKPOINT_FAULTS", "finalize.after_metadata:checkpoint=4")
        else:
            monkeypatch.delenv("CHECKPOINT_FAULTS", raising=False)

        run = dag.test()

        if increment == 4:
            assert run.state == "failed"
            assert (job_dir / "chk-4" / "_metadata").exists()
            # committed in storage, not yet in the sinks: readers still see checkpoint 3
            assert_tables_match(base, pd.concat(landed[:-2]))
            continue
        assert run.state == "success", f"run {increment} ended {run.state}"
        assert_tables_match(base, pd.concat(landed))

        if increment == 2:
            chk = job_dir / "chk-2" / "step_page_views_table"
            assert not (chk / "attempt-1").exists(), "attempt-1 files must be discarded"
            page_views = json.loads((job_dir / "chk-2" / "_metadata").read_text())["operators"]["page_views"]
            # small state travels inline (below inline_state_threshold); files would be attempt-2's
            assert page_views.get("inline") and not page_views["handles"]

    stats = [json.loads((job_dir / "_stats" / f"{i}.json").read_text()) for i in range(1, 6)]
    assert [s["status"] for s in stats] == ["COMPLETED"] * 5
    assert sorted(p.name for p in job_dir.glob("chk-*")) == ["chk-3", "chk-4", "chk-5"]
    meta5 = json.loads((job_dir / "chk-5" / "_metadata").read_text())
    assert meta5["restored_from"] == 4 and meta5["checkpoint_id"] == 5
    assert meta5["stats"]["records_in"] == 240
    assert not list((base / "marts").glob("*/_staging/chk-*")), "no staged data may be left behind"
    storage = JobStorage.for_job(f"file://{tmp_path}/checkpoints", "example_clickstream")
    assert audit_job(storage, retained=3, sinks=example_dag.pipeline.job.graph.sinks) == []


def test_malformed_record_fails_the_step_and_commits_nothing(example_dag, tmp_path):
    dag = example_dag.dag
    base = tmp_path / "clickstream"
    landing = base / "landing"
    job_dir = tmp_path / "checkpoints" / "example_clickstream"
    good = land_events(landing, "good-1.json", 120, 7)
    assert dag.test().state == "success"

    more = land_events(landing, "good-2.json", 60, 8)
    (landing / "broken.json").write_text('{"user": "x", "page": "/p1", "ts": 1}\n{"user": "y", "page": \n')
    run = dag.test()
    assert run.state == "failed"
    steps = {ti.task_id: ti for ti in run.get_task_instances() if ti.task_id.startswith("step_")}
    assert all(ti.state == "failed" and ti.try_number == 1 for ti in steps.values()), "bad input is not retried"
    assert_tables_match(base, good)  # nothing of the failed checkpoint is visible
    stats = json.loads((job_dir / "_stats" / "2.json").read_text())
    assert stats["status"] == "ABORTED" and stats["reason"] == "declined"
    assert not (job_dir / "chk-2").exists()

    (landing / "broken.json").write_text(
        '{"user": "x", "page": "/p1", "ts": 1}\n{"user": "y", "page": "/p2", "ts": 2}\n'
    )
    assert dag.test().state == "success"
    fixed = pd.DataFrame([{"user": "x", "page": "/p1", "ts": 1}, {"user": "y", "page": "/p2", "ts": 2}])
    assert_tables_match(base, pd.concat([good, more, fixed]))
    assert json.loads((job_dir / "chk-3" / "_metadata").read_text())["checkpoint_id"] == 3
    assert asset_event_checkpoints(f"file://{base}/marts/page_views") == [1, 3], "no event for the aborted one"


def asset_event_checkpoints(uri: str) -> list[int]:
    """Checkpoint ids in the Airflow Asset events recorded for ``uri`` (metadata DB)."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(
            select(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id).where(AssetModel.uri == uri)
        ).all()
        return sorted(int(e.extra["checkpoint_id"]) for e in rows)
