"""The Kafka example (``dags/example_kafka.py``) through real Airflow (``dag.test()``), real Spark, the
test session's Kafka-protocol broker (Tansu) and PostgreSQL, with the connections given as a user gives them.

After every run and after a restore, the Delta tables (read with delta-rs ``scan()``) and the
PostgreSQL table (psycopg) equal pandas over the records the test produced: each record once.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pandas as pd
import pyarrow as pa
import pytest

from tests.airflow.conftest import load_dag_module
from tests.conftest import REPO

pytestmark = pytest.mark.airflow
SCHEMA = "example_kafka"


@pytest.fixture
def kafka_example(airflow_db, kafka_broker, postgres_server, tmp_path, monkeypatch) -> Iterator[ModuleType]:
    topic = f"clicks-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, 3)
    monkeypatch.setenv("KAFKA_TOPIC", topic)
    monkeypatch.setenv("KAFKA_EXAMPLE_DIR", str(tmp_path / "kafka"))
    monkeypatch.setenv("KAFKA_PG_SCHEMA", SCHEMA)
    monkeypatch.setenv("AIRFLOW_CONN_CLICKS_KAFKA", kafka_broker.uri())
    monkeypatch.setenv("AIRFLOW_CONN_CLICKS_PG", postgres_server.uri())
    monkeypatch.setenv("AIRFLOW__CHECKPOINT__STORAGE_ROOT", f"file://{tmp_path}/checkpoints")
    monkeypatch.delenv("CHECKPOINT_FAULTS", raising=False)
    with postgres_server.connect() as db:
        db.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        db.execute(f"CREATE SCHEMA {SCHEMA}")
    yield load_dag_module(REPO / "dags" / "example_kafka.py")


def produce(broker, topic: str, n: int, seed: int) -> pd.DataFrame:
    rng = random.Random(seed)
    rows = [
        {"user": f"u{rng.randrange(40)}", "page": f"/p{rng.randrange(9)}", "ts": rng.randrange(10**6)} for _ in range(n)
    ]
    broker.produce(topic, [(rng.randrange(3), r["user"].encode(), json.dumps(r).encode()) for r in rows])
    return pd.DataFrame(rows)


def delta(path: Path) -> pd.DataFrame:
    from deltalake import DeltaTable

    return pa.table(DeltaTable(str(path)).scan()).to_pandas()  # scan() applies deletion vectors


def assert_tables(tmp_path: Path, server, produced: list[pd.DataFrame]) -> None:
    events = pd.concat(produced, ignore_index=True)
    want = events.groupby("user").agg(clicks=("ts", "size"), last_ts=("ts", "max")).reset_index()
    want = want.sort_values("user").reset_index(drop=True)
    lake = tmp_path / "kafka" / "lake"
    got = delta(lake / "click_totals")[["user", "clicks", "last_ts"]].sort_values("user").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want, check_dtype=False, obj="click_totals (Delta)")
    with server.connect() as db:
        cur = db.execute(
            f"SELECT user, clicks, last_ts FROM {SCHEMA}.click_totals ORDER BY 1".replace("user,", '"user",')
        )
        pg = pd.DataFrame(cur.fetchall(), columns=["user", "clicks", "last_ts"])
    pd.testing.assert_frame_equal(pg, want, check_dtype=False, obj="click_totals (PostgreSQL)")
    clicks = delta(lake / "clicks")
    assert not clicks.duplicated(["partition", "offset"]).any(), "a record was appended twice"
    assert sorted(map(tuple, clicks[["user", "page", "ts"]].values.tolist())) == sorted(
        map(tuple, events[["user", "page", "ts"]].values.tolist())
    )


def step_tries(run_id: str) -> dict[str, int]:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        found = session.query(TaskInstance).filter(TaskInstance.run_id == run_id).all()
        return {ti.task_id: ti.try_number for ti in found if ti.task_id.startswith("step_")}


def test_example_kafka_exactly_once_and_restore(kafka_example, kafka_broker, postgres_server, tmp_path, monkeypatch):
    dag, topic = kafka_example.dag, kafka_example.TOPIC
    produced = []
    for run in range(1, 4):
        produced.append(produce(kafka_broker, topic, 300, seed=run))
        if run == 2:  # the Python worker reading a partition is killed mid-read on the step's first attempt
            monkeypatch.setenv("CHECKPOINT_FAULTS", "step.kafka_read:checkpoint=2:attempt=1:partition=1:action=kill")
        elif run == 3:  # finalize dies right after the commit point, on every attempt: the next run finishes it
            monkeypatch.setenv("CHECKPOINT_FAULTS", "finalize.after_metadata:checkpoint=3")
        dag_run = dag.test()
        monkeypatch.delenv("CHECKPOINT_FAULTS", raising=False)
        assert dag_run.state == ("failed" if run == 3 else "success"), f"run {run}"
        if run < 3:
            assert_tables(tmp_path, postgres_server, produced)
        if run == 2:  # both steps read the topic: each was killed once and acked on its second try
            assert step_tries(dag_run.run_id) == {"step_click_totals_delta__click_totals_pg": 2, "step_clicks_delta": 2}

    restore = load_dag_module(REPO / "dags" / "restore_from_checkpoint.py").dag
    conf = {"job_id": "example_kafka", "checkpoint": "1", "trigger_pipeline": False}
    assert restore.test(run_conf=conf).state == "success"
    produced.append(produce(kafka_broker, topic, 100, seed=9))
    assert dag.test().state == "success"  # checkpoint 3 committed first; then runs 2 and 3 replayed, once
    assert_tables(tmp_path, postgres_server, produced)


def test_example_kafka_parses_without_broker_or_connection(airflow_db, monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_CLICKS_KAFKA", raising=False)
    module = load_dag_module(REPO / "dags" / "example_kafka.py")
    (source,) = module.pipeline.job.graph.sources
    assert source.describe()["topics"] == [module.TOPIC]
