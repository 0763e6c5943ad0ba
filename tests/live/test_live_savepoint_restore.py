"""Savepoint and restore through the real Airflow services and REST API v2.

The example pipeline runs under the scheduler (LocalExecutor, one Spark JVM per step),
triggered as a user or a CI job would trigger it. After every checkpoint the three sink
tables must equal the pandas ground truth over every event landed so far; after the
restore from a savepoint too, although the checkpoint taken between savepoint and
restore had already committed output: exactly once, the append table included.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import pytest

from tests.live.airflow_live import UI_SAVEPOINT_CONF, LiveAirflow
from tests.live.conftest import Clickstream
from tests.live.storage_view import Deadline, completed_ids, known_ids, latest_metadata, read_json, savepoint_dirs

pytestmark = pytest.mark.live

PIPELINE = "example_clickstream"
RESTORE = "restore_from_checkpoint"
RUN_TIMEOUT = 360.0  # one pipeline run
RESTORE_TIMEOUT = 480.0  # the restore DAG, including the pipeline run it triggers and waits for
TEST_BUDGET = 900.0


def checkpoint(live: LiveAirflow, conf: Mapping[str, Any], deadline: Deadline) -> str:
    run_id = live.trigger(PIPELINE, conf)
    live.wait_for_run(PIPELINE, run_id, timeout=deadline.bounded(RUN_TIMEOUT))
    return run_id


def assert_quiet_step_logs(live: LiveAirflow, run_id: str) -> None:
    """A healthy step's task log: no ERROR line (Airflow's level for stderr), no progress bar, phase lines."""
    run_dir = live.home / "logs" / f"dag_id={PIPELINE}" / f"run_id={run_id}"
    logs = sorted(run_dir.glob("task_id=step_*/**/*.log"))
    assert len(logs) == 3, f"expected the task logs of three steps under {run_dir}, found {logs}"
    for path in logs:
        records = [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]
        errors = [r for r in records if str(r.get("level")).lower() in ("error", "critical")]
        assert not errors, f"{path}: ERROR lines in a healthy step:\n" + "\n".join(map(str, errors[:10]))
        events = [str(r.get("event")) for r in records]
        assert not any(re.search(r"\[Stage \d+", e) for e in events), f"{path}: console progress bar"
        assert any(re.match(r"source events: .*records_in \d+ in [\d.]+s", e) for e in events), f"{path}: {events}"


@pytest.mark.full  # CI: the UI savepoint test, and the chaos test restores through the restore DAG
def test_savepoint_then_restore_is_exactly_once(live_airflow: LiveAirflow, clickstream: Clickstream) -> None:
    live, job = live_airflow, live_airflow.job_dir
    deadline = Deadline(TEST_BUDGET)

    # 1. a plain checkpoint
    clickstream.land(300)
    first = checkpoint(live, {}, deadline)
    assert clickstream.mismatches() == {}
    assert_quiet_step_logs(live, first)

    # 2. a savepoint, with the conf the UI form sends
    clickstream.land(200)
    before = savepoint_dirs(live.savepoint_root)
    checkpoint(live, UI_SAVEPOINT_CONF, deadline)
    new = savepoint_dirs(live.savepoint_root) - before
    assert len(new) == 1, f"expected one new savepoint under {live.savepoint_root}, found {sorted(new)}"
    savepoint = new.pop()
    sp_meta = read_json(savepoint / "_metadata")
    assert sp_meta["type"] == "savepoint" and sp_meta["relocatable"] is True
    assert sp_meta["checkpoint_id"] == completed_ids(job)[-1], "the savepoint copies the newest checkpoint"
    job_record = read_json(job / "_job.json")
    assert job_record["status"] == "RUNNING", "stop_after_savepoint=false keeps the job running"
    assert {"checkpoint_id": sp_meta["checkpoint_id"], "path": f"file://{savepoint}"}.items() <= next(
        sp for sp in job_record["savepoints"] if sp["checkpoint_id"] == sp_meta["checkpoint_id"]
    ).items()
    assert clickstream.mismatches() == {}

    # 3. a plain checkpoint after the savepoint: its output is committed to the sinks
    clickstream.land(250)
    checkpoint(live, {}, deadline)
    assert clickstream.mismatches() == {}
    ids_before_restore = known_ids(job)

    # 4. more input, then restore from the savepoint through the restore DAG, which
    #    triggers the pipeline and waits for its checkpoint
    clickstream.land(150)
    conf = {
        "job_id": PIPELINE,
        "checkpoint": str(savepoint),
        "allow_non_restored_state": False,
        "dry_run": False,
        "trigger_pipeline": True,
    }
    restore_run = live.trigger(RESTORE, conf)
    live.wait_for_run(RESTORE, restore_run, timeout=deadline.bounded(RESTORE_TIMEOUT))
    assert live.task_states(RESTORE, restore_run) == {
        "request_restore": "success",
        "should_trigger": "success",
        "trigger_pipeline": "success",
    }
    summary = live.xcom(RESTORE, restore_run, "request_restore")
    assert summary["snapshot"] == f"file://{savepoint}"
    assert summary["checkpoint_id"] == sp_meta["checkpoint_id"] and summary["type"] == "savepoint"
    assert summary["operators_restored"] == ["page_views", "user_totals"]
    pipeline_run = live.xcom(RESTORE, restore_run, "trigger_pipeline", key="trigger_run_id")
    assert live.run_state(PIPELINE, pipeline_run) == "success"

    # the restore request was taken, and the new checkpoint continues from the savepoint
    assert not (job / "_restore.json").exists(), "the completed checkpoint must clear the restore request"
    restored = latest_metadata(job)
    assert restored["restored_from"] == sp_meta["checkpoint_id"]
    assert restored["checkpoint_id"] > max(ids_before_restore), "checkpoint ids never go back"
    plan = read_json(job / f"chk-{restored['checkpoint_id']}" / "_plan.json")
    assert plan["run_id"] == pipeline_run, "the restoring checkpoint is the run the restore DAG triggered"
    assert read_json(job / "_job.json")["status"] == "RUNNING"

    # exactly once over everything landed: the post-savepoint output was rolled back and
    # recomputed from the savepoint's state and source positions, not added twice
    assert clickstream.mismatches() == {}
    assert (savepoint / "_metadata").exists(), "a savepoint survives restores and retention"
