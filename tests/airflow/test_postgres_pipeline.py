"""A pipeline writing to a real PostgreSQL through real Airflow (``dag.test()``) and real Spark, through faults.

Click events land in increments; one step writes the raw events (append) and views per page
(upsert) to PostgreSQL. Run 2 kills the server in the middle of the step's bulk load and
restarts it (the Spark job fails, Airflow retries the step); run 3 dies in finalize between
the two sinks' commits (the finalize retry dies there too; the next trigger's recovery commits
the second sink, the first one's marker makes its repeat a no-op); run 4 crashes the server
(immediate shutdown, crash recovery at the restart) after the step staged and before it acks, so
finalize commits from staging tables that went through crash recovery; run 5 has a wrong password
(refused by the trigger, which asks the table whether checkpoint 4 is committed). After every
run both tables equal pandas over the events of the committed checkpoints: nothing lost,
nothing doubled; so do they after the restore DAG returns the job to checkpoint 3 and the next
run replays events 4 and 5 (the rows of checkpoints 4 and 5 were undone, not doubled).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from airflow_provider_checkpoint.testing.clickstream import land_events
from tests.airflow.conftest import load_dag_module, own_dags_folder
from tests.conftest import REPO

pytestmark = pytest.mark.airflow
DAG_FILE = """
import datetime
import os
from pathlib import Path

from airflow_provider_checkpoint import CheckpointedPipeline, FileSource, KeyedAggregate, Transform
from airflow_provider_checkpoint.connectors.postgres.sink import PostgresTableSink
from tests.servers.postgres import PostgresServer


def kill_and_restart_once(df):
    '''While PG_CHAOS names a server, the first batch an executor reads kills it and starts it again.'''
    spec = os.environ.get("PG_CHAOS")
    if not spec:
        return df
    done = Path(PostgresServer.from_json(spec).pgdata).parent / "chaos-done"

    def chaos(batches):
        for batch in batches:
            if not done.exists():
                done.touch()
                server = PostgresServer.from_json(spec)
                server.kill()
                server.start()
            yield batch

    return df.mapInArrow(chaos, df.schema)


with CheckpointedPipeline(dag_id="pg_clicks", schedule=None, retry_delay=datetime.timedelta(seconds=1)) as pipeline:
    events = FileSource(
        uid="events", path=os.environ["PG_LANDING"], format="json", schema="user STRING, page STRING, ts LONG"
    )
    views = KeyedAggregate(uid="views", input=events, keys=["page"], aggs={"views": "count", "last_seen": "max(ts)"})
    PostgresTableSink(
        uid="a_views", input=views, conn_id="pg_chaos", table="clicks.views", mode="upsert", keys=["page"], step="main"
    )
    raw = Transform(uid="chaos", input=events, fn=kill_and_restart_once)
    PostgresTableSink(uid="b_events", input=raw, conn_id="pg_chaos", table="clicks.events", step="main")

dag = pipeline.dag
"""


def _crash_when_paused(server, pause_dir: Path, point: str) -> threading.Thread:
    """A thread that, once a task pauses at fault point ``point``, crashes the server (immediate
    shutdown), starts it again (checking in its log that crash recovery ran) and lets the task go on."""

    def crash() -> None:
        deadline = time.monotonic() + 600
        while not (pause_dir / f"{point}.paused").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        log = server.pgdata / "server.log"
        recoveries = log.read_text(errors="replace").count("automatic recovery in progress")
        server.kill()
        server.start()
        if log.read_text(errors="replace").count("automatic recovery in progress") == recoveries + 1:
            (pause_dir / "crashed").touch()
        (pause_dir / f"{point}.resume").touch()

    thread = threading.Thread(target=crash, daemon=True)
    thread.start()
    return thread


def _tables(server) -> dict[str, pd.DataFrame]:
    with server.connect() as db:
        views = db.execute("SELECT page, views, last_seen FROM clicks.views").fetchall()
        events = db.execute('SELECT "user", page, ts FROM clicks.events').fetchall()
    return {
        "views": pd.DataFrame(views, columns=["page", "views", "last_seen"]).sort_values("page", ignore_index=True),
        "events": pd.DataFrame(events, columns=["user", "page", "ts"]).sort_values("ts", ignore_index=True),
    }


def _truth(events: list[pd.DataFrame]) -> dict[str, pd.DataFrame]:
    every = pd.concat(events, ignore_index=True)
    views = every.groupby("page").agg(views=("ts", "size"), last_seen=("ts", "max")).reset_index()
    return {"views": views, "events": every.sort_values("ts", ignore_index=True)}


def _assert_tables(server, views: list[pd.DataFrame], events: list[pd.DataFrame]) -> None:
    got, want_views, want_events = _tables(server), _truth(views)["views"], _truth(events)["events"]
    pd.testing.assert_frame_equal(got["views"], want_views, check_dtype=False)
    pd.testing.assert_frame_equal(got["events"], want_events, check_dtype=False)


def test_exactly_once_into_postgres_through_a_server_crash_and_finalize_faults(
    airflow_db, postgres_server, tmp_path, monkeypatch
):
    monkeypatch.setenv("PG_LANDING", str(tmp_path / "landing"))
    monkeypatch.setenv("AIRFLOW__CHECKPOINT__STORAGE_ROOT", f"file://{tmp_path}/checkpoints")
    monkeypatch.setenv("AIRFLOW_CONN_PG_CHAOS", postgres_server.uri())
    with postgres_server.connect() as db:
        db.execute("CREATE SCHEMA clicks")
    module = own_dags_folder(tmp_path, monkeypatch, "pg_clicks", DAG_FILE)
    landed: list[pd.DataFrame] = []
    for checkpoint_id in range(1, 5):
        landed.append(land_events(tmp_path / "landing", f"events-{checkpoint_id}.json", 200, seed=checkpoint_id))
        monkeypatch.delenv("PG_CHAOS", raising=False)
        monkeypatch.delenv("CHECKPOINT_FAULTS", raising=False)
        if checkpoint_id == 2:
            monkeypatch.setenv("PG_CHAOS", postgres_server.to_json())
        if checkpoint_id == 3:
            monkeypatch.setenv("CHECKPOINT_FAULTS", "finalize.between_sink_commits:checkpoint=3:sink=a_views")
        if checkpoint_id == 4:
            pause_dir = tmp_path / "pause"
            pause_dir.mkdir()
            monkeypatch.setenv("CHECKPOINT_FAULTS_PAUSE_DIR", str(pause_dir))
            monkeypatch.setenv("CHECKPOINT_FAULTS", "step.before_ack:checkpoint=4:action=pause")
            crasher = _crash_when_paused(postgres_server, pause_dir, "step.before_ack")

        run = module.dag.test()

        if checkpoint_id == 4:
            crasher.join(60)
            assert (pause_dir / "crashed").exists(), "the server crashed after the step staged, and recovered"

        if checkpoint_id == 3:  # a_views has checkpoint 3, b_events not yet
            assert run.state == "failed"
            _assert_tables(postgres_server, landed, landed[:2])
            continue
        assert run.state == "success", f"run {checkpoint_id} ended {run.state}"
        _assert_tables(postgres_server, landed, landed)  # run 4: checkpoint 3 recovered once, then 4
        if checkpoint_id == 2:
            assert (postgres_server.pgdata.parent / "chaos-done").exists(), "the server was killed during the step"
            step = next(ti for ti in run.get_task_instances() if ti.task_id.startswith("step_"))
            assert step.try_number == 2, "the step failed with the server and was retried"
    monkeypatch.setenv("AIRFLOW_CONN_PG_CHAOS", postgres_server.uri(password="wrong"))
    landed.append(land_events(tmp_path / "landing", "events-5.json", 200, seed=5))
    # checkpoint 4 is finished (its stats record is written last), so the trigger asks no sink; the step is
    # refused and checkpoint 5 is aborted with nothing written
    run = module.dag.test()
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert run.state == "failed" and states["trigger_checkpoint"] == "success" and states["step_main"] == "failed"
    _assert_tables(postgres_server, landed[:4], landed[:4])
    monkeypatch.setenv("AIRFLOW_CONN_PG_CHAOS", postgres_server.uri())
    assert module.dag.test().state == "success"  # checkpoint 6
    _assert_tables(postgres_server, landed, landed)

    restore = load_dag_module(REPO / "dags" / "restore_from_checkpoint.py").dag
    assert (
        restore.test(run_conf={"job_id": "pg_clicks", "checkpoint": "3", "trigger_pipeline": False}).state == "success"
    )
    assert module.dag.test().state == "success"  # checkpoint 7: both tables back to 3, then events 4 and 5 again
    _assert_tables(postgres_server, landed, landed)
    with postgres_server.connect() as db:
        staged = db.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'clicks' AND tablename LIKE '\\_cks\\_%\\_c%'"
        )
        assert staged.fetchone() == (0,), "no staging table left behind"
        markers = db.execute("SELECT sink_uid, checkpoint_id FROM clicks.checkpoint_sink_markers ORDER BY 1, 2")
        assert markers.fetchall() == [(s, c) for s in ("a_views", "b_events") for c in (1, 2, 3, 7)]
    written = [p for root in (tmp_path / "checkpoints", Path(os.environ["AIRFLOW_HOME"])) for p in root.rglob("*")]
    leaked = [p for p in written if p.is_file() and postgres_server.password.encode() in p.read_bytes()]
    assert len(written) > 20 and leaked == [], "the password is in no checkpoint document and no task log"
