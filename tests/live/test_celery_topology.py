"""A production topology survives a scheduler and a Celery worker dying mid-checkpoint, exactly once.

The real Airflow services run from the venv on loopback: PostgreSQL metadata database (a
database of its own on the session's server), CeleryExecutor with Debian's ``redis-server``
as broker (started by the test, nothing on disk), two schedulers, two Celery workers, the
api-server, dag-processor and triggerer. The example clickstream pipeline takes three
checkpoints triggered through REST API v2:

1. a step pauses at its ack (a fault point) while the first scheduler is SIGKILLed; the step
   resumes, and the other scheduler completes the checkpoint;
2. a step pauses at its ack and the Celery worker running it is SIGKILLed with every process
   it started (the task process and its Spark JVM): the step's task instance stops
   heartbeating, the scheduler fails it after ``[scheduler] task_instance_heartbeat_timeout``,
   Airflow retries it on the other worker, and the checkpoint completes;
3. a plain one, on the remaining scheduler and worker.

After each, all three tables equal the pandas ground truth over every event landed; at the
end every run and task instance of the pipeline is ``success`` (nothing orphaned or stuck).
The recovery time of each death (from the SIGKILL to the checkpoint's completion) is
printed with the settings that bound it (:data:`RECOVERY_SETTINGS`)::

    AIRFLOW_RECOVERY_DEFAULTS=1 pytest tests/live/test_celery_topology.py -s   # Airflow's defaults (minutes)
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.live.airflow_live import LiveAirflow, poll, running_airflow
from tests.live.conftest import Clickstream
from tests.live.topology import Topology, ancestors
from tests.servers.postgres import USER, PostgresServer
from tests.servers.redis import redis_binary, running_redis

pytestmark = pytest.mark.live

PIPELINE = "example_clickstream"
PAUSED_STEP = "step_page_views_table"  # attempt 1 of this step pauses at its ack while the test kills a process
RUN_TIMEOUT = 240.0
EVENTS_PER_CHECKPOINT = 300
TERMINAL_OK = "success"

RECOVERY_SETTINGS = {
    # a running task instance whose heartbeat is older than this is failed (and retried): bounds a
    # worker's death (default 300 s); the task's supervisor heartbeats every [workers]
    # min_heartbeat_interval (5 s)
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "20",
    # how often a scheduler looks for such task instances (default 10 s)
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
    # a scheduler whose heartbeat is older than this counts as dead (default 30 s) ...
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "15",
    # ... and this often a live scheduler adopts the task instances a dead one queued (default 300 s):
    # only the scheduler that queued a task instance fails it for a missing heartbeat
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "10",
}


@pytest.fixture
def metadata_database(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh database of the session's PostgreSQL server for Airflow's metadata: its SQLAlchemy URL."""
    name = f"airflow_{secrets.token_hex(4)}"
    with postgres_server.connect() as db:
        db.execute(f"CREATE DATABASE {name}")
    try:
        yield f"postgresql+psycopg2://{USER}:{postgres_server.password}@127.0.0.1:{postgres_server.port}/{name}"
    finally:
        with postgres_server.connect() as db:
            db.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


class PausedStep:
    """Attempt 1 of :data:`PAUSED_STEP` in checkpoint ``checkpoint`` waits at its ack (the
    ``step.before_ack`` fault point) until :meth:`resume`, or until the test kills it."""

    def __init__(self, live: LiveAirflow, checkpoint: int) -> None:
        self.live = live
        self.paused = self.pause_dir / "step.before_ack.paused"
        self.faults.write_text(f"step.before_ack:checkpoint={checkpoint}:step={PAUSED_STEP}:attempt=1:action=pause\n")

    @property
    def faults(self) -> Path:
        return Path(self.live.env["CHECKPOINT_FAULTS_FILE"])

    @property
    def pause_dir(self) -> Path:
        return Path(self.live.env["CHECKPOINT_FAULTS_PAUSE_DIR"])

    def wait(self, run_id: str) -> None:
        def paused() -> bool:
            self.live.check_alive()
            if self.live.run_state(PIPELINE, run_id) in ("success", "failed"):
                raise AssertionError(f"run {run_id} ended before step {PAUSED_STEP} paused")
            return self.paused.exists()

        poll(f"step {PAUSED_STEP} of {run_id} to pause at its ack", paused, RUN_TIMEOUT)

    def disarm(self) -> None:
        self.faults.write_text("")
        self.paused.unlink(missing_ok=True)

    def resume(self) -> None:
        self.disarm()
        (self.pause_dir / "step.before_ack.resume").touch()

    def clear(self) -> None:
        (self.pause_dir / "step.before_ack.resume").unlink(missing_ok=True)


def paused_task_instance(live: LiveAirflow, run_id: str) -> dict[str, Any]:
    """The task instance of :data:`PAUSED_STEP` in run ``run_id`` (REST API v2)."""
    return dict(
        live.api_json("GET", f"/api/v2/dags/{PIPELINE}/dagRuns/{quote(run_id, safe='')}/taskInstances/{PAUSED_STEP}")
    )


def step_worker(live: LiveAirflow, run_id: str, workers: list[str]) -> str:
    """The Celery worker that started the running task process of :data:`PAUSED_STEP`."""
    ti = paused_task_instance(live, run_id)
    assert ti["state"] == "running" and ti["pid"], f"{PAUSED_STEP} is not running: {ti}"
    holders = [w for w in workers if live.procs[w].pid in ancestors(ti["pid"])]
    assert len(holders) == 1, f"task process {ti['pid']} descends from {holders}, expected one of {workers}"
    return holders[0]


def checkpoint(live: LiveAirflow, clicks: Clickstream) -> str:
    clicks.land(EVENTS_PER_CHECKPOINT)
    return live.trigger(PIPELINE, {})


def assert_nothing_left(live: LiveAirflow, runs: list[str]) -> None:
    """Every run of the pipeline and each of its task instances ended ``success``: none orphaned, none stuck."""
    found = live.api_json("GET", f"/api/v2/dags/{PIPELINE}/dagRuns")["dag_runs"]
    assert {r["dag_run_id"]: r["state"] for r in found} == dict.fromkeys(runs, TERMINAL_OK)
    tis = live.api_json("GET", f"/api/v2/dags/{PIPELINE}/dagRuns/~/taskInstances")["task_instances"]
    stuck = {(t["dag_run_id"], t["task_id"]): t["state"] for t in tis if t["state"] != TERMINAL_OK}
    assert stuck == {}, f"task instances not success: {stuck}"


@pytest.mark.full  # about 300 s: make test-full
def test_scheduler_and_worker_death_under_celery(metadata_database: str) -> None:
    if redis_binary() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("redis-server is not installed; in CI this test must run: run scripts/install_redis.sh first")
        pytest.skip("redis-server is not installed (run scripts/install_redis.sh)")
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="airflow-checkpoint-celery-")).resolve()
    (root / "faults.txt").write_text("")
    (root / "paused").mkdir()
    defaults = os.environ.get("AIRFLOW_RECOVERY_DEFAULTS") == "1"
    run_timeout = RUN_TIMEOUT + (600.0 if defaults else 0.0)  # the defaults wait 300 s for a task's heartbeat
    env = {"CHECKPOINT_FAULTS_FILE": str(root / "faults.txt"), "CHECKPOINT_FAULTS_PAUSE_DIR": str(root / "paused"),
           **({} if defaults else RECOVERY_SETTINGS)}  # fmt: skip
    with running_redis() as redis, contextlib.ExitStack() as on_failure:
        on_failure.callback(print, f"\nCelery topology: Airflow home, data and logs kept in {root}")
        topology = Topology(metadata_database, redis.url(), schedulers=2, celery_workers=2, worker_concurrency=3)
        with running_airflow(root, dag_ids=(PIPELINE,), extra_env=env, topology=topology) as live:
            print(f"\n{topology.executor}: services ready in {time.monotonic() - started:.0f}s; recovery settings: "
                  f"{'Airflow defaults' if defaults else RECOVERY_SETTINGS}", flush=True)  # fmt: skip
            clicks, runs = Clickstream(live), []

            # 1. a scheduler dies while the checkpoint is in flight
            pause = PausedStep(live, checkpoint=1)
            runs.append(checkpoint(live, clicks))
            pause.wait(runs[-1])
            killed_at = time.monotonic()
            killed = live.kill("scheduler")
            pause.resume()
            live.wait_for_run(PIPELINE, runs[-1], timeout=run_timeout)
            scheduler_recovery = time.monotonic() - killed_at
            pause.clear()
            print(f"scheduler SIGKILLed ({Counter(killed)}): checkpoint 1 completed {scheduler_recovery:.0f}s later")
            assert clicks.mismatches() == {}

            # 2. the Celery worker running a step dies mid-step, with the task's Spark JVM
            pause = PausedStep(live, checkpoint=2)
            runs.append(checkpoint(live, clicks))
            pause.wait(runs[-1])
            worker = step_worker(live, runs[-1], topology.worker_names())
            killed_at, killed_wall = time.monotonic(), datetime.now(UTC)
            killed = live.kill(worker)
            pause.disarm()
            live.wait_for_run(PIPELINE, runs[-1], timeout=run_timeout)
            worker_recovery = time.monotonic() - killed_at
            step = paused_task_instance(live, runs[-1])
            retried = (datetime.fromisoformat(step["start_date"]) - killed_wall).total_seconds()
            print(f"{worker} SIGKILLed ({Counter(killed)}): {PAUSED_STEP} attempt {step['try_number']} started "
                  f"{retried:.0f}s later, checkpoint 2 completed {worker_recovery:.0f}s later")  # fmt: skip
            assert "java" in killed, f"the step's Spark JVM was not among the processes of {worker}: {killed}"
            assert step["try_number"] == 2, "the killed step ran again as attempt 2"
            assert clicks.mismatches() == {}

            # 3. the remaining scheduler and worker take the next checkpoint
            t = time.monotonic()
            runs.append(checkpoint(live, clicks))
            live.wait_for_run(PIPELINE, runs[-1], timeout=run_timeout)
            print(f"checkpoint 3 (plain, one scheduler, one worker) in {time.monotonic() - t:.0f}s")
            assert clicks.mismatches() == {}
            assert_nothing_left(live, runs)
        on_failure.pop_all()
    print(f"celery topology test in {time.monotonic() - started:.0f}s; recovery after a scheduler's death "
          f"{scheduler_recovery:.0f}s, after a worker's death {worker_recovery:.0f}s")  # fmt: skip
    shutil.rmtree(root, ignore_errors=True)
