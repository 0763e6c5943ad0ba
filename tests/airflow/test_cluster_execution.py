"""The example pipeline, unchanged, through the Spark provider's connections (``dag.test()``).

* ``spark`` connection → every step is spark-submitted (client mode) to a real Spark
  standalone cluster started from the installed pyspark; in one increment the step is
  paused mid-way (fault point ``pause``) while its executor JVM is SIGKILLed.
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
from tests.live.airflow_live import poll
from tests.live.spark_connect import spark_connect_server
from tests.spark_standalone import StandaloneCluster, standalone_cluster

pytestmark = pytest.mark.airflow
PAUSE_POINT = "step.before_state_write"


@pytest.fixture(scope="session")
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


def test_example_pipeline_on_a_standalone_cluster_through_a_spark_connection(
    example_dag, spark_cluster, tmp_path, monkeypatch
):
    host, port = spark_cluster.master_url.rsplit(":", 1)
    use_connection(monkeypatch, "spark_cluster", {"conn_type": "spark", "host": host, "port": int(port)})
    dag, base = example_dag.dag, tmp_path / "clickstream"
    landed: list[pd.DataFrame] = []
    for increment in (1, 2):
        landed.append(land_events(base / "landing", f"events-{increment}.json", 200, increment))
        killed: list[int] = []
        errors: list[str] = []
        killer = None
        if increment == 2:
            pause_dir = tmp_path / "pause"
            pause_dir.mkdir()
            monkeypatch.setenv(
                "CHECKPOINT_FAULTS", f"{PAUSE_POINT}:checkpoint=2:step=step_page_views_table:action=pause"
            )
            monkeypatch.setenv("CHECKPOINT_FAULTS_PAUSE_DIR", str(pause_dir))
            killer = threading.Thread(
                target=kill_executors_while_paused, args=(spark_cluster, pause_dir, killed, errors)
            )
            killer.start()
        else:
            monkeypatch.delenv("CHECKPOINT_FAULTS", raising=False)

        run = dag.test()

        if killer is not None:
            killer.join(timeout=60)
            assert errors == [] and killed, f"executor kill: {errors}"
            assert not any(psutil.pid_exists(p) for p in killed)
        assert run.state == "success", f"run {increment} ended {run.state}"
        assert mismatches(base / "marts", pd.concat(landed)) == {}, f"after checkpoint {increment}"

    apps = {app["name"] for app in spark_cluster.state()["completedapps"]}
    for step in ("step_page_views_table", "step_user_totals_table", "step_events_archive"):
        assert f"checkpoint-example_clickstream-1-{step}-attempt-1" in apps, f"{step} did not run on the cluster"
    job_dir = tmp_path / "checkpoints" / "example_clickstream"
    assert not list(job_dir.glob("chk-*/*/attempt-*/_ack.json")), "acks are read back and removed"


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
