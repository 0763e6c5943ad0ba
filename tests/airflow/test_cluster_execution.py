"""The example pipeline, unchanged, through the Spark provider's connections (``dag.test()``).

* ``spark`` connection → the pipeline's one step (its three sinks in one: one Spark application
  per checkpoint) is spark-submitted (client mode) to a real Spark
  standalone cluster started from the installed pyspark, with no shared filesystem: the
  landing area, the tables, the storage root and the savepoints are on the S3 server, and
  the executors get no credentials from their environment. In one increment the step is
  paused mid-way (fault point ``pause``) while its executor JVM is SIGKILLed; a savepoint
  is restored through the restore DAG (``make test-full`` only: in CI, ``tests/s3/test_s3_pipeline.py``
  restores through the restore DAG on S3 and ``tests/s3/test_s3_coordinator.py`` a savepoint on S3); the
  Checkpoints page's API and the CLI read the job.
* ``spark_connect`` connection → every step runs on a Spark Connect server.

After every checkpoint the three tables must equal the pandas ground truth over all input.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import psutil
import pytest

from airflow_provider_checkpoint.testing.clickstream import land_events, mismatches
from tests.airflow.conftest import airflow_db, checkpoints_client, cli, load_dag_module, own_dags_folder  # noqa: F401 - a fixture
from tests.conftest import FULL, REPO
from tests.live.airflow_live import poll
from tests.live.spark_connect import spark_connect_server
from tests.s3.clickstream_s3 import JOB, ONE_STEP, everything_on_s3, s3_clickstream_source
from tests.s3.s3_job import land, s3fs_of, table_mismatches
from tests.servers.s3 import S3Server
from tests.spark_standalone import StandaloneCluster, standalone_cluster

pytestmark = pytest.mark.airflow
PAUSE_POINT = "step.before_state_write"


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    with standalone_cluster(tmp_path_factory.mktemp("spark-standalone")) as cluster:
        yield cluster


def use_connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, conn: dict) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))
    monkeypatch.setenv("AIRFLOW__CHECKPOINT__SPARK_CONN_ID", conn_id)


def kill_executors_while_paused(
    cluster: StandaloneCluster, pause_dir: Path, killed: list[int], errors: list[str]
) -> None:
    """Wait until the step pauses, SIGKILL its executor JVM(s), then let the step go on."""
    try:
        poll("the step to pause mid-way", lambda: (pause_dir / f"{PAUSE_POINT}.paused").exists(), 300, 0.2)
        pids = cluster.executor_pids()
        if not pids:
            errors.append("no executor JVM found under the worker while the step was paused")
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
            psutil.Process(pid).wait(timeout=30) if psutil.pid_exists(pid) else None
        killed.extend(pids)
    except Exception as e:
        errors.append(repr(e))
    finally:
        (pause_dir / f"{PAUSE_POINT}.resume").touch()


@pytest.mark.usefixtures("airflow_db")
def test_example_pipeline_on_a_standalone_cluster_with_everything_on_s3(
    spark_cluster, s3_server: S3Server, tmp_path, monkeypatch, capsys
):
    """No shared filesystem: landing area, tables, storage root and savepoints on the S3 server."""
    host, port = spark_cluster.master_url.rsplit(":", 1)
    use_connection(monkeypatch, "spark_cluster", {"conn_type": "spark", "host": host, "port": int(port)})
    prefix = everything_on_s3(s3_server, monkeypatch).removeprefix("s3://")
    dag = own_dags_folder(tmp_path, monkeypatch, JOB, s3_clickstream_source(one_step=True)).dag
    restore = load_dag_module(REPO / "dags" / "restore_from_checkpoint.py").dag
    fs, local = s3fs_of(s3_server), tmp_path / "local"
    landing, marts, job = f"{prefix}/clickstream/landing", f"{prefix}/clickstream/marts", f"{prefix}/checkpoints/{JOB}"
    landed: list[pd.DataFrame] = []

    def checkpoint(increment: int, n: int, **conf: object) -> None:
        landed.append(land(fs, local, landing, f"events-{increment}.json", n, increment))
        assert dag.test(run_conf=conf or None).state == "success", f"run {increment}"
        assert table_mismatches(fs, marts, pd.concat(landed)) == {}, f"after run {increment}"

    # checkpoint 1, with a savepoint to S3
    checkpoint(1, 200, savepoint=True, savepoint_dir=None, stop_after_savepoint=False)
    (savepoint,) = fs.ls(f"{prefix}/savepoints")
    assert json.loads(fs.cat_file(f"{savepoint}/_metadata"))["checkpoint_id"] == 1

    # checkpoint 2: the step pauses mid-way while its executor JVM is SIGKILLed
    pause_dir = tmp_path / "pause"
    pause_dir.mkdir()
    monkeypatch.setenv("CHECKPOINT_FAULTS", f"{PAUSE_POINT}:checkpoint=2:step=step_{ONE_STEP}:action=pause")
    monkeypatch.setenv("CHECKPOINT_FAULTS_PAUSE_DIR", str(pause_dir))
    killed: list[int] = []
    errors: list[str] = []
    killer = threading.Thread(target=kill_executors_while_paused, args=(spark_cluster, pause_dir, killed, errors))
    killer.start()
    try:
        checkpoint(2, 150, savepoint=False)  # dag.test() keeps the last run's params
    finally:
        killer.join(timeout=60)
    monkeypatch.delenv("CHECKPOINT_FAULTS")
    assert errors == [] and killed, f"executor kill: {errors}"
    assert not any(psutil.pid_exists(p) for p in killed)

    history = [(2, "COMPLETED", ""), (1, "COMPLETED", "")]
    if FULL:  # restore the savepoint through the restore DAG: checkpoint 3 replays events-2 and events-3 once
        conf = {"job_id": JOB, "checkpoint": f"s3://{savepoint}", "trigger_pipeline": False}
        assert restore.test(run_conf=conf).state == "success"
        checkpoint(3, 120, savepoint=False)
        history.insert(0, (3, "COMPLETED", f"s3://{savepoint}"))
    latest = history[0][0]
    meta = json.loads(fs.cat_file(f"{job}/chk-{latest}/_metadata"))
    assert not FULL or (meta["restored_from"] == 1 and meta["stats"]["records_in"] == 270)
    state_files = [h for op in meta["operators"].values() for h in op["handles"]]
    assert state_files and all(fs.size(f"{job}/{h['path']}") == h["size"] for h in state_files)

    logs = capsys.readouterr().out  # the submitted drivers' output, as the task logs record it
    assert "stateful page_views: state_rows" in logs, "one line per phase"
    assert " INFO SparkContext" not in logs and "clientserver" not in logs, "Spark's and py4j's INFO in task logs"
    apps = {app["name"] for app in spark_cluster.state()["completedapps"]}
    assert f"checkpoint-{JOB}-{latest}-step_{ONE_STEP}-attempt-1" in apps, "the step did not run on the cluster"
    assert not fs.glob(f"{job}/chk-*/*/attempt-*/_ack.json"), "acks are read back and removed"
    leftovers = [p for p in spark_cluster.executor_files() if p.name not in ("stdout", "stderr")]
    assert leftovers == [], "the executors wrote only to S3"
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "clickstream").exists()

    status, listed = checkpoints_api(JOB, "status", "history")
    assert status["latest_completed"]["checkpoint_id"] == latest and status["storage"] == f"s3://{job}"
    assert [(s["checkpoint_id"], s["path"]) for s in status["savepoints"]] == [(1, f"s3://{savepoint}")]
    assert [(r["checkpoint_id"], r["status"], r["restored_from_url"]) for r in listed["rows"]] == history
    code, out, err = cli(capsys, "show", JOB, str(latest), "--output", "json")
    assert code == 0 and json.loads(out)["metadata"] == f"s3://{job}/chk-{latest}/_metadata", err


def checkpoints_api(dag_id: str, *endpoints: str) -> list[dict]:
    """``GET /checkpoints/api/dags/<dag_id>/<endpoint>`` as the Checkpoints page calls them: through
    Airflow's own API app (the plugin mounted by Airflow, its auth with an admin's token), in this process.
    """
    client, headers = checkpoints_client()
    out = []
    for endpoint in endpoints:
        response = client.get(f"/checkpoints/api/dags/{dag_id}/{endpoint}", headers=headers)
        assert response.status_code == 200, response.text
        out.append(response.json())
    return out


def stop_connect_sessions() -> None:
    """Stop the Spark Connect sessions the steps opened in this process (dag.test runs tasks in it)."""
    from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

    for session in {RemoteSparkSession.getActiveSession(), RemoteSparkSession._get_default_session()} - {None}:
        session.stop()
    os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)  # set by pyspark: later sessions would be remote too


def stop_classic_session() -> None:
    """Earlier ``dag.test()`` runs left an embedded session in this process; a worker process would not have one."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()


@pytest.mark.full  # CI: the chaos test runs every step through a spark_connect connection
def test_example_pipeline_through_a_spark_connect_connection(example_dag, tmp_path, monkeypatch):
    dag, base = example_dag.dag, tmp_path / "clickstream"
    landed: list[pd.DataFrame] = []
    stop_classic_session()
    with spark_connect_server(tmp_path / "spark-connect.log") as url:
        host, port = url.removeprefix("sc://").rsplit(":", 1)
        conn = {"conn_type": "spark_connect", "host": host, "port": int(port)}
        use_connection(monkeypatch, "spark_connect_test", conn)
        try:
            for increment in (1, 2):
                landed.append(land_events(base / "landing", f"events-{increment}.json", 150, increment))
                run = dag.test()
                assert run.state == "success", f"run {increment} ended {run.state}"
                assert mismatches(base / "marts", pd.concat(landed)) == {}, f"after checkpoint {increment}"
        finally:
            stop_connect_sessions()


def test_killing_the_step_kills_its_driver(example_dag, tmp_path, monkeypatch):
    """``on_kill`` of a submitted step (here with a ``local[1]`` spark connection) leaves no driver process."""
    from airflow_provider_checkpoint.spark.processes import tagged_processes
    from airflow_provider_checkpoint.spark.submitted import SubmittedStep

    use_connection(monkeypatch, "spark_local", {"conn_type": "spark", "host": "local[1]"})
    land_events(tmp_path / "clickstream" / "landing", "events-1.json", 50, 1)
    job = example_dag.pipeline.job
    plan = job.coordinator().trigger("manual__kill")
    pause_dir = tmp_path / "pause"
    pause_dir.mkdir()
    monkeypatch.setenv("CHECKPOINT_FAULTS", f"{PAUSE_POINT}:action=pause")
    monkeypatch.setenv("CHECKPOINT_FAULTS_PAUSE_DIR", str(pause_dir))
    step = SubmittedStep(job, "spark_local", str(example_dag.__file__), "example_clickstream", "step_page_views_table")
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            step.run(job.storage(), "step_page_views_table", plan, 1)
            outcome.append(None)
        except BaseException as e:
            outcome.append(e)

    runner = threading.Thread(target=run)
    runner.start()
    poll("the driver to pause mid-step", lambda: (pause_dir / f"{PAUSE_POINT}.paused").exists(), 240, 0.2)
    driver = psutil.Process(step.hook._submit_sp.pid)
    processes = [driver, *driver.children(recursive=True)]
    tagged = tagged_processes(step.tag)
    assert any("submit.py" in " ".join(_cmdline(p)) for p in tagged), "the Python driver runs under spark-submit"
    assert any("SparkSubmit" in " ".join(_cmdline(p)) for p in tagged), "the driver JVM is found by its tag"
    step.kill()
    runner.join(timeout=60)
    assert not runner.is_alive() and outcome and outcome[0] is not None, "the killed step must fail"
    gone, alive = psutil.wait_procs([*processes, *tagged], timeout=30)
    alive = [p for p in alive if _cmdline(p)]  # an exited, not yet reaped process has no command line
    assert alive == [], f"still running after on_kill: {[(p.pid, _cmdline(p)[:3]) for p in alive]}"
    assert tagged_processes(step.tag) == [], "no process of the attempt is left, reparented ones included"
    assert not (
        tmp_path / "checkpoints" / "example_clickstream" / "chk-1" / "step_page_views_table" / "attempt-1" / "_ack.json"
    ).exists()


def _cmdline(process: psutil.Process) -> list[str]:
    """The command line, or nothing for a process that already exited (a zombie has none)."""
    try:
        return process.cmdline()
    except psutil.Error:
        return []
