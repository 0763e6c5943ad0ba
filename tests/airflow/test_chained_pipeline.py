"""``chain=True`` through real Airflow (``dag.test()``) and real local Spark.

A single-step clickstream pipeline (page views per page) runs every checkpoint in one
task. After every run its table must equal a pandas ground truth over all input landed
so far, whatever fault was injected: a retry aborts the failed try's checkpoint (counted
once) and cuts a new barrier, except after ``_metadata``, where it finishes that commit.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pandas as pd
import pytest

from airflow_provider_checkpoint.jobs.audit import audit_job
from airflow_provider_checkpoint.pipeline import CHAINED_TASK_ID, WAIT_FOR_INPUT_TASK_ID
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.testing.clickstream import expected_tables, land_events, normalized, read_table
from tests.airflow.conftest import checkpoints_client, cli, load_dag_module, own_dags_folder
from tests.airflow.test_example_clickstream import asset_event_checkpoints
from tests.conftest import REPO

pytestmark = pytest.mark.airflow
JOB = "chained_clickstream"


CHAINED_DAGS = """
import datetime
import os
from pathlib import Path

from airflow_provider_checkpoint import CheckpointedPipeline, FileSource, KeyedAggregate, ParquetTableSink

BASE = Path(os.environ["CHAINED_DIR"])
pipelines = {}
for dag_id, wait in (("chained_clickstream", None), ("chained_sensed", datetime.timedelta(seconds=2))):
    with CheckpointedPipeline(
        dag_id=dag_id, schedule=None, chain=True, retry_delay=datetime.timedelta(0), wait_for_input=wait
    ) as pipeline:  # events -> page views -> an upserted table: one step, chained into one task
        events = FileSource(uid="events", path=str(BASE / dag_id / "landing"), format="json",
                            schema="user STRING, page STRING, ts LONG")
        views = KeyedAggregate(uid="page_views", input=events, keys=["page"],
                               aggs={"views": "count", "last_seen": "max(ts)"})
        ParquetTableSink(uid="page_views_table", input=views, path=str(BASE / dag_id / "page_views"),
                         mode="upsert", keys=["page"])
    pipelines[dag_id] = pipeline
    globals()[dag_id] = pipeline.dag
"""


@pytest.fixture
def chained(airflow_db: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """Two chained pipelines (one with ``wait_for_input``) in a DAGs folder of their own."""
    monkeypatch.setenv("CHAINED_DIR", str(tmp_path / "clickstream"))
    monkeypatch.setenv("AIRFLOW__CHECKPOINT__STORAGE_ROOT", f"file://{tmp_path}/checkpoints")
    monkeypatch.setenv("AIRFLOW__CHECKPOINT__SAVEPOINT_ROOTS", f"file://{tmp_path}/savepoints")
    yield own_dags_folder(tmp_path, monkeypatch, "chained", CHAINED_DAGS)
    os.environ.pop("CHECKPOINT_FAULTS", None)


def assert_table_matches(base: Path, landed: list[pd.DataFrame]) -> None:
    truth = normalized(expected_tables(pd.concat(landed))["page_views"], "page_views")
    pd.testing.assert_frame_equal(normalized(read_table(base / "page_views"), "page_views"), truth)


def stats(job_dir: Path) -> dict[int, dict]:
    return {int(p.stem): json.loads(p.read_text()) for p in (job_dir / "_stats").glob("*.json")}


def tries(run) -> dict[str, int]:
    return {ti.task_id: ti.try_number for ti in run.get_task_instances()}


def test_retries_cut_new_barriers_and_output_is_exactly_once(chained, tmp_path, monkeypatch, capsys):
    pipeline, base, job_dir = chained.pipelines[JOB], tmp_path / "clickstream" / JOB, tmp_path / "checkpoints" / JOB
    faults = {
        2: "step.before_ack:checkpoint=2:attempt=1",  # the step of try 1 fails: chk-2 declined, try 2 cuts chk-3
        3: "finalize.before_metadata:checkpoint=4",  # finalize of try 1 fails: chk-4 aborted, try 2 cuts chk-5
        4: "finalize.after_metadata:checkpoint=6:attempt=1",  # try 1 dies past the commit point of chk-6
    }
    landed: list[pd.DataFrame] = []
    for increment in range(1, 6):
        landed.append(land_events(base / "landing", f"events-{increment}.json", 120 + 10 * increment, increment))
        if increment in faults:
            monkeypatch.setenv("CHECKPOINT_FAULTS", faults[increment])
        else:
            monkeypatch.delenv("CHECKPOINT_FAULTS", raising=False)
        run = pipeline.dag.test()
        assert run.state == "success", f"run {increment} ended {run.state}"
        assert tries(run) == {CHAINED_TASK_ID: 2 if increment in faults else 1}
        assert_table_matches(base, landed)

    by_id = stats(job_dir)
    assert {i: s["status"] for i, s in by_id.items()} == {
        1: "COMPLETED", 2: "ABORTED", 3: "COMPLETED", 4: "ABORTED", 5: "COMPLETED", 6: "COMPLETED", 7: "COMPLETED"
    }  # fmt: skip
    assert (by_id[2]["reason"], by_id[2]["counted"]) == ("declined", True)
    assert (by_id[4]["reason"], by_id[4]["counted"]) == ("finalize_failure", True)
    run_of = {i: s["run_id"] for i, s in by_id.items() if "run_id" in s}
    assert run_of[2] == run_of[3] and run_of[4] == run_of[5], "the retry cut its barrier in the same run"
    restored_from = {
        i: json.loads((job_dir / f"chk-{i}" / "_metadata").read_text())["restored_from"] for i in (5, 6, 7)
    }
    assert restored_from == {5: 3, 6: 5, 7: 6}, "an aborted id is never restored from, the chk-6 commit is kept"
    assert json.loads((job_dir / "_job.json").read_text())["failures"]["failed_ids"] == []
    assert not (job_dir / "_lease").exists()
    assert asset_event_checkpoints(f"file://{base}/page_views") == [1, 3, 5, 6, 7]
    storage = JobStorage.for_job(f"file://{tmp_path}/checkpoints", JOB)
    assert audit_job(storage, retained=3, sinks=pipeline.job.graph.sinks) == []

    code, out, _ = cli(capsys, "history", JOB, "--output", "json")
    rows = json.loads(out)
    assert code == 0 and [r["checkpoint_id"] for r in rows] == [7, 6, 5, 4, 3, 2, 1]
    assert [r["status"] for r in rows if r["checkpoint_id"] in (2, 4)] == ["ABORTED", "ABORTED"]

    # each try of the chained task is the checkpoint it cut: chk-2 by try 1 and chk-3 by try 2 of one run
    for checkpoint_id, try_number in ((1, 1), (2, 1), (3, 2), (4, 1), (5, 2), (6, 1)):
        code, out, err = cli(capsys, "show", JOB, str(checkpoint_id), "--output", "json")
        assert code == 0, err
        (step,) = json.loads(out)["steps"]
        assert [a["try_number"] for a in step["attempts"]] == [try_number], (checkpoint_id, step["attempts"])
    client, headers = checkpoints_client()
    configuration = client.get(f"/checkpoints/api/dags/{JOB}/configuration", headers=headers).json()
    assert configuration["chain"] is True and configuration["sinks"] == ["page_views_table"]


def test_savepoint_stop_and_restore_through_the_restore_dag(chained, tmp_path):
    pipeline, base, job_dir = chained.pipelines[JOB], tmp_path / "clickstream" / JOB, tmp_path / "checkpoints" / JOB
    restore = load_dag_module(REPO / "dags" / "restore_from_checkpoint.py").dag
    landed = [land_events(base / "landing", "e1.json", 200, 11)]
    assert pipeline.dag.test().state == "success"
    landed.append(land_events(base / "landing", "e2.json", 150, 12))
    run = pipeline.dag.test(run_conf={"savepoint": True, "savepoint_dir": None, "stop_after_savepoint": True})
    assert run.state == "success"
    (savepoint,) = (tmp_path / "savepoints").glob("savepoint-chaine-*")
    assert json.loads((savepoint / "_metadata").read_text())["checkpoint_id"] == 2
    assert_table_matches(base, landed)

    landed.append(land_events(base / "landing", "e3.json", 100, 13))
    stopped = pipeline.dag.test()  # the job is STOPPED: the run is skipped, nothing is read
    assert {ti.task_id: ti.state for ti in stopped.get_task_instances()} == {CHAINED_TASK_ID: "skipped"}
    assert not (job_dir / "chk-3").exists()

    conf = {"job_id": JOB, "checkpoint": str(savepoint), "trigger_pipeline": False}
    assert restore.test(run_conf=conf).state == "success"
    assert pipeline.dag.test().state == "success"
    meta = json.loads((job_dir / "chk-3" / "_metadata").read_text())
    assert meta["restored_from"] == 2 and meta["checkpoint_id"] == 3
    assert_table_matches(base, landed)  # e3 exactly once


def test_wait_for_input_skips_the_chained_task_without_new_input(chained, tmp_path):
    pipeline = chained.pipelines["chained_sensed"]
    base, job_dir = tmp_path / "clickstream" / "chained_sensed", tmp_path / "checkpoints" / "chained_sensed"
    landed = [land_events(base / "landing", "e1.json", 90, 21)]
    assert pipeline.dag.test().state == "success"
    empty = pipeline.dag.test()
    assert {ti.task_id: ti.state for ti in empty.get_task_instances()} == {
        WAIT_FOR_INPUT_TASK_ID: "skipped",
        CHAINED_TASK_ID: "skipped",
    }
    assert sorted(p.name for p in job_dir.glob("chk-*")) == ["chk-1"]
    assert_table_matches(base, landed)
