"""Sensors in poke mode through real Airflow (``dag.test()``) and real local Spark.

A pipeline with ``wait_for_input`` skips a run without new input (no checkpoint, no
failure counted) and proceeds with new input; a downstream DAG waits for the pipeline's
checkpoint and reads the committed table, checked against the pandas ground truth.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from airflow_provider_checkpoint.pipeline import WAIT_FOR_INPUT_TASK_ID
from airflow_provider_checkpoint.testing.clickstream import expected_tables, land_events, normalized
from tests.airflow.conftest import own_dags_folder

pytestmark = pytest.mark.airflow
JOB = "sensed_clickstream"


SENSED_DAGS = """
import datetime
import json
import os
from pathlib import Path

from airflow.sdk import DAG, task

from airflow_provider_checkpoint import CheckpointedPipeline, FileSource, KeyedAggregate, ParquetTableSink
from airflow_provider_checkpoint.sensors.checkpoint import CheckpointCompletedSensor
from airflow_provider_checkpoint.testing.clickstream import read_table

BASE = Path(os.environ["SENSED_DIR"])
STORAGE = os.environ["SENSED_STORAGE"]

with CheckpointedPipeline(
    dag_id="sensed_clickstream", schedule=None, storage=STORAGE, wait_for_input=datetime.timedelta(seconds=2)
) as pipeline:
    events = FileSource(uid="events", path=str(BASE / "landing"), format="json",
                        schema="user STRING, page STRING, ts LONG")
    views = KeyedAggregate(uid="page_views", input=events, keys=["page"],
                           aggs={"views": "count", "last_seen": "max(ts)"})
    ParquetTableSink(uid="page_views_table", input=views, path=str(BASE / "marts" / "page_views"),
                     mode="upsert", keys=["page"])

for after, timeout in ((1, 30), (2, 1)):
    with DAG(f"downstream_after_{after}", schedule=None, start_date=datetime.datetime(2026, 1, 1),
             params={"storage": STORAGE}) as dag:
        wait = CheckpointCompletedSensor(  # storage is templated: rendered before the sensor reads it
            task_id="wait_for_checkpoint", job_id="sensed_clickstream", storage="{{ params.storage }}",
            after_checkpoint_id=after, poke_interval=0.5, timeout=timeout, deferrable=False,
        )

        @task
        def report(checkpoint: dict, out: str = str(BASE / f"downstream-{after}.json")) -> None:
            table = read_table(BASE / "marts" / "page_views")
            Path(out).write_text(json.dumps({"checkpoint": checkpoint, "rows": table.to_dict("records")}))

        report(wait.output)
    globals()[f"downstream_{after}"] = dag
"""


@pytest.fixture
def sensed_dags(airflow_db, tmp_path, monkeypatch):
    """The pipeline (with ``wait_for_input``) and two downstream DAGs, in a DAGs folder of their own."""
    monkeypatch.setenv("SENSED_DIR", str(tmp_path / "clickstream"))
    monkeypatch.setenv("SENSED_STORAGE", f"file://{tmp_path}/checkpoints")
    (tmp_path / "clickstream" / "landing").mkdir(parents=True)
    return own_dags_folder(tmp_path, monkeypatch, "sensed", SENSED_DAGS)


def states(run) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in run.get_task_instances()}


def test_input_sensor_skips_empty_runs_and_downstream_reads_the_committed_table(sensed_dags, tmp_path):
    base = tmp_path / "clickstream"
    job_dir = tmp_path / "checkpoints" / JOB
    dag = sensed_dags.pipeline.dag
    landed = [land_events(base / "landing", "events-1.json", 120, 1)]

    first = dag.test()
    assert first.state == "success" and states(first)[WAIT_FOR_INPUT_TASK_ID] == "success"

    empty = dag.test()  # nothing new landed: skipped, not an empty checkpoint
    assert set(states(empty).values()) == {"skipped"}, states(empty)
    assert sorted(p.name for p in job_dir.glob("chk-*")) == ["chk-1"]
    assert sorted(p.name for p in (job_dir / "_stats").iterdir()) == ["1.json"]
    assert json.loads((job_dir / "_job.json").read_text())["failures"]["failed_ids"] == []

    landed.append(land_events(base / "landing", "events-2.json", 80, 2))
    second = dag.test()
    assert second.state == "success" and (job_dir / "chk-2" / "_metadata").exists()
    truth = normalized(expected_tables(pd.concat(landed))["page_views"], "page_views")

    assert sensed_dags.downstream_1.test().state == "success"
    seen = json.loads((base / "downstream-1.json").read_text())
    assert seen["checkpoint"]["checkpoint_id"] == 2
    pd.testing.assert_frame_equal(normalized(pd.DataFrame(seen["rows"]), "page_views"), truth)

    run = sensed_dags.downstream_2.test()  # nothing newer than checkpoint 2 comes: the sensor times out
    assert run.state == "failed" and states(run)["wait_for_checkpoint"] == "failed"
    assert not (base / "downstream-2.json").exists()
