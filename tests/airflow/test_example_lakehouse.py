"""The lakehouse example through real Airflow (``dag.test()``) and real local Spark: two pipelines
chained through a Delta table. After every run both Delta tables, read with delta-rs, must equal
a pandas ground truth over all events landed so far, whatever fault was injected and however
many upstream commits one downstream run reads."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from airflow_provider_checkpoint.testing.clickstream import land_events
from tests.airflow.conftest import load_dag_module
from tests.airflow.test_example_clickstream import asset_event_checkpoints
from tests.conftest import REPO

pytestmark = pytest.mark.airflow


@pytest.fixture
def lakehouse(airflow_db: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The example lakehouse DAGs, with their data and checkpoints under ``tmp_path``."""
    monkeypatch.setenv("LAKEHOUSE_DIR", str(tmp_path / "lakehouse"))
    monkeypatch.setenv("AIRFLOW__CHECKPOINT__STORAGE_ROOT", f"file://{tmp_path}/checkpoints")
    (tmp_path / "lakehouse" / "landing").mkdir(parents=True)
    yield load_dag_module(REPO / "dags" / "example_lakehouse.py")
    os.environ.pop("CHECKPOINT_FAULTS", None)


def expected(events: pd.DataFrame) -> dict[str, pd.DataFrame]:
    users = events.groupby("user").agg(events=("ts", "size"), last_seen=("ts", "max")).reset_index()
    users["tier"] = np.select([users["events"] >= 20, users["events"] >= 10], ["heavy", "regular"], "light")
    tiers = users.groupby("tier").agg(users=("user", "size"), events=("events", "sum")).reset_index()
    return {"user_totals": users.drop(columns="tier"), "tiers": tiers}


def delta(path: Path, keys: list[str]) -> pd.DataFrame:
    df = pa.table(DeltaTable(str(path)).scan()).to_pandas()  # scan() applies deletion vectors
    return df.sort_values(keys, ignore_index=True)[sorted(df.columns)]


def assert_table(base: Path, name: str, truth: pd.DataFrame, keys: list[str]) -> None:
    got = delta(base / "lake" / name, keys)
    if name == "tiers":  # a tier all users left keeps a row of zeros
        got = got[got["users"] != 0].reset_index(drop=True)
    pd.testing.assert_frame_equal(
        got, truth.sort_values(keys, ignore_index=True)[sorted(truth.columns)], check_dtype=False
    )


def test_two_pipelines_chained_through_a_delta_table_exactly_once(lakehouse, tmp_path, monkeypatch):
    base = tmp_path / "lakehouse"
    ingest, tiers = lakehouse.ingest_dag, lakehouse.tiers_dag
    uri = lakehouse.user_totals_table.asset_uri()
    assert [a.uri for a in tiers.timetable.asset_condition.objects] == [uri], "the tiers job runs on the table's Asset"
    landed: list[pd.DataFrame] = []
    # (ingest runs before the tiers run, the fault injected into the tiers run)
    rounds = [(1, None), (2, "step.before_ack:checkpoint=2:attempt=1"), (1, "finalize.after_metadata:checkpoint=3")]
    for number, (ingests, fault) in enumerate(rounds, 1):
        for _ in range(ingests):
            landed.append(land_events(base / "landing", f"events-{len(landed)}.json", 120, len(landed), users=20))
            assert ingest.test().state == "success"
        truth = expected(pd.concat(landed))
        assert_table(base, "user_totals", truth["user_totals"], ["user"])

        monkeypatch.setenv("CHECKPOINT_FAULTS", fault or "")
        run = tiers.test()
        monkeypatch.delenv("CHECKPOINT_FAULTS")
        if fault and fault.startswith("finalize"):  # committed in storage; the next run finishes the commit
            assert run.state == "failed"
            run = tiers.test()
        assert run.state == "success", f"round {number}: tiers run ended {run.state}"
        if fault and fault.startswith("step"):
            tries = [ti.try_number for ti in run.get_task_instances() if ti.task_id.startswith("step_")]
            assert tries == [2], "the step died once before acking and was retried"
        assert_table(base, "tiers", truth["tiers"], ["tier"])

    assert asset_event_checkpoints(uri) == [1, 2, 3, 4]
    versions = DeltaTable(str(base / "lake" / "user_totals")).history()
    assert len([v for v in versions if v["operation"] != "CREATE TABLE"]) <= 4, "one Delta commit per checkpoint"
