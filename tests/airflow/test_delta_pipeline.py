"""A pipeline writing Delta tables through real Airflow (``dag.test()``) and local Spark.

After every run both tables equal a pandas ground truth over all events landed so far; the
Asset events and the savepoint entry carry the Delta version each checkpoint committed; a
restore to checkpoint 1 returns both tables to checkpoint 1's version in one commit, and
the replay adds the later events exactly once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pandas as pd
import pyarrow as pa
import pytest

from airflow_provider_checkpoint.jobs.audit import audit_job
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.testing.clickstream import expected_tables, land_events, normalized
from tests.airflow.conftest import load_dag_module, own_dags_folder
from tests.conftest import REPO
from tests.spark.helpers import delta_commits_per_checkpoint

pytestmark = pytest.mark.airflow
JOB = "delta_clicks"
DAG_FILE = """
import os

from airflow_provider_checkpoint import CheckpointedPipeline, DeltaTableSink, FileSource, KeyedAggregate

BASE = os.environ["DELTA_DIR"]

with CheckpointedPipeline(dag_id="delta_clicks", schedule=None) as pipeline:
    events = FileSource(uid="events", path=f"{BASE}/landing", format="json", schema="user STRING, page STRING, ts LONG")
    users = KeyedAggregate(uid="user_totals", input=events, keys=["user"],
                           aggs={"events": "count", "first_seen": "min(ts)", "last_seen": "max(ts)"})
    DeltaTableSink(uid="user_totals_table", input=users, path=f"{BASE}/user_totals", mode="upsert", keys=["user"])
    DeltaTableSink(uid="events_table", input=events, path=f"{BASE}/events", partition_by=["page"])

dag = pipeline.dag
"""


@pytest.fixture
def delta_dag(airflow_db: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.setenv("DELTA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("AIRFLOW__CHECKPOINT__STORAGE_ROOT", f"file://{tmp_path}/checkpoints")
    monkeypatch.setenv("AIRFLOW__CHECKPOINT__SAVEPOINT_ROOTS", f"file://{tmp_path}/savepoints")
    yield own_dags_folder(tmp_path, monkeypatch, JOB, DAG_FILE)


def assert_tables(base: Path, landed: list[pd.DataFrame]) -> None:
    from deltalake import DeltaTable

    truth = expected_tables(pd.concat(landed))
    for table, path in (("user_totals", base / "user_totals"), ("events", base / "events")):
        got = pa.table(DeltaTable(str(path)).scan()).to_pandas()  # scan() applies deletion vectors
        pd.testing.assert_frame_equal(normalized(got, table), normalized(truth[table], table), obj=table)


def asset_event_versions(uri: str) -> list[tuple[int, int]]:
    """(checkpoint id, Delta version) of the Airflow Asset events recorded for ``uri``."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(
            select(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id).where(AssetModel.uri == uri)
        ).all()
        return sorted((int(e.extra["checkpoint_id"]), int(e.extra["delta_version"])) for e in rows)


def test_delta_tables_exactly_once_with_versions_and_restore(delta_dag, tmp_path):
    from deltalake import DeltaTable

    pipeline, base, job_dir = delta_dag.dag, tmp_path / "data", tmp_path / "checkpoints" / JOB
    landed = [land_events(base / "landing", "e1.json", 200, 1)]
    assert pipeline.test().state == "success"
    assert_tables(base, landed)
    landed.append(land_events(base / "landing", "e2.json", 150, 2))
    assert pipeline.test(run_conf={"savepoint": True, "savepoint_dir": None}).state == "success"
    landed.append(land_events(base / "landing", "e3.json", 100, 3))
    # dag.test() keeps the last run's conf in the DAG's Param objects: the next plain run is no savepoint
    assert pipeline.test().state == "success"
    assert_tables(base, landed)

    totals = base / "user_totals"
    assert asset_event_versions(f"file://{totals}") == [(1, 1), (2, 2), (3, 3)]  # version 0: the create
    savepoints = json.loads((job_dir / "_job.json").read_text())["savepoints"]
    assert [(sp["checkpoint_id"], sp["sinks"]["user_totals_table"]) for sp in savepoints] == [(2, {"delta_version": 2})]

    restore = load_dag_module(REPO / "dags" / "restore_from_checkpoint.py").dag
    conf = {"job_id": JOB, "checkpoint": "1", "trigger_pipeline": False}
    assert restore.test(run_conf=conf).state == "success"
    assert pipeline.test().state == "success"  # checkpoint 4: back to 1, e2 and e3 again
    assert_tables(base, landed)
    for path, write in ((totals, "MERGE"), (base / "events", "WRITE")):  # upserts commit as MERGE
        operations = [h["operation"] for h in reversed(DeltaTable(str(path)).history())]
        assert operations == ["CREATE TABLE", write, write, write, "RESTORE", write], path
        assert delta_commits_per_checkpoint(path) == {1: 1, 2: 1, 3: 1, 4: 1}
    sinks = delta_dag.pipeline.job.graph.sinks
    assert audit_job(JobStorage.for_job(f"file://{tmp_path}/checkpoints", JOB), 3, sinks) == []
