"""The PostgreSQL example (``dags/example_postgres.py``) through real Airflow (``dag.test()``),
real Spark and the test session's real PostgreSQL, with the connection given the way a user
gives it (``AIRFLOW_CONN_<ID>``).

After every run, and after a restore, the three tables equal a ground truth computed with
pandas over the events of the committed checkpoints (:mod:`~airflow_provider_checkpoint.testing.clickstream`).
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pandas as pd
import pytest

from airflow_provider_checkpoint.jobs.audit import audit_job
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.testing.clickstream import TABLES, expected_tables, land_events, normalized
from tests.airflow.conftest import load_dag_module
from tests.conftest import REPO

pytestmark = pytest.mark.airflow
SCHEMA = "example_pg"


@pytest.fixture
def postgres_example(airflow_db, postgres_server, tmp_path, monkeypatch) -> Iterator[ModuleType]:
    """The example DAG over its own schema of the test server, with data and checkpoints under ``tmp_path``."""
    monkeypatch.setenv("CLICKSTREAM_DIR", str(tmp_path / "clickstream"))
    monkeypatch.setenv("CLICKSTREAM_PG_SCHEMA", SCHEMA)
    monkeypatch.setenv("AIRFLOW_CONN_CLICKSTREAM_PG", postgres_server.uri())
    monkeypatch.setenv("AIRFLOW__CHECKPOINT__STORAGE_ROOT", f"file://{tmp_path}/checkpoints")
    monkeypatch.delenv("CHECKPOINT_FAULTS", raising=False)
    with postgres_server.connect() as db:
        db.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        db.execute(f"CREATE SCHEMA {SCHEMA}")
    yield load_dag_module(REPO / "dags" / "example_postgres.py")


def assert_tables_match(server, events: list[pd.DataFrame]) -> None:
    """Each table (without the sink's ``_checkpoint_id``) equals pandas over ``events``."""
    truth = expected_tables(pd.concat(events, ignore_index=True))
    for table in TABLES:
        with server.connect() as db:
            cur = db.execute(f"SELECT * FROM {SCHEMA}.{table}")
            rows = pd.DataFrame(cur.fetchall(), columns=[c.name for c in cur.description])
        got = normalized(rows.drop(columns=["_checkpoint_id"], errors="ignore"), table)
        pd.testing.assert_frame_equal(got, normalized(truth[table], table), obj=table)


def test_example_postgres_exactly_once_and_restore(postgres_example, postgres_server, tmp_path, monkeypatch):
    dag = postgres_example.dag
    landing = tmp_path / "clickstream" / "landing"
    landed: list[pd.DataFrame] = []
    for checkpoint_id in range(1, 5):
        landed.append(land_events(landing, f"events-{checkpoint_id}.json", 150, seed=checkpoint_id))
        assert dag.test().state == "success", f"run {checkpoint_id}"
        assert_tables_match(postgres_server, landed)

    restore = load_dag_module(REPO / "dags" / "restore_from_checkpoint.py").dag
    conf = {"job_id": "example_postgres", "checkpoint": "2", "trigger_pipeline": False}
    assert restore.test(run_conf=conf).state == "success"
    # the next run's trigger rolls the tables back to checkpoint 2; its finalize dies before the
    # commit point, so the tables stay as checkpoint 2 left them
    monkeypatch.setenv("CHECKPOINT_FAULTS", "finalize.before_metadata")
    assert dag.test().state == "failed"
    assert_tables_match(postgres_server, landed[:2])

    monkeypatch.delenv("CHECKPOINT_FAULTS")
    landed.append(land_events(landing, "events-5.json", 150, seed=5))
    assert dag.test().state == "success"  # events 3 and 4 once more, and 5: none doubled
    assert_tables_match(postgres_server, landed)

    storage = JobStorage.for_job(f"file://{tmp_path}/checkpoints", "example_postgres")
    assert audit_job(storage, retained=3, sinks=postgres_example.pipeline.job.graph.sinks) == []


def test_example_postgres_parses_without_connection_or_server(airflow_db, monkeypatch):
    """Importing the DAG file (as the DAG processor does) needs neither: a run checks them first."""
    monkeypatch.delenv("AIRFLOW_CONN_CLICKSTREAM_PG", raising=False)
    monkeypatch.setenv("CLICKSTREAM_PG_CONN", "no_such_connection")
    module = load_dag_module(REPO / "dags" / "example_postgres.py")
    sinks = {s.uid: s.describe()["table"] for s in module.pipeline.job.graph.sinks}
    assert sinks == {
        "page_views_pg": "public.page_views (connection no_such_connection)",
        "user_totals_pg": "public.user_totals (connection no_such_connection)",
        "events_pg": "public.events (connection no_such_connection)",
    }
