"""Probe through real Airflow: write access to one job's or table's directory gives no effect outside it.

Starting from the completed savepoint run of ``scene`` (the example pipeline), each test
crafts links in a table, a forged ``_metadata`` in the job directory, a savepoint target
in a job's checkpoint tree or a checkpoint copied into another job's directory; runs the
pipeline (trigger, steps, finalize) or the restore DAG with ``dag.test()``; and asserts
the run fails, saying why, while every file and directory of the neighbours — another
table, another job, an outside directory — is unchanged. Afterwards the job recovers and
its tables equal the ground truth computed with pandas over all input.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from airflow_provider_checkpoint.jobs.audit import audit_job
from airflow_provider_checkpoint.testing.clickstream import land_events, mismatches
from airflow_provider_checkpoint.testing.neighbours import fingerprints, plant_neighbours, tree
from tests.airflow.test_untrusted_snapshots import JOB, scene  # noqa: F401 - the fixture

pytestmark = pytest.mark.airflow


@pytest.fixture
def neighbours(scene: dict[str, Any], tmp_path: Path) -> dict[str, Path]:  # noqa: F811
    return plant_neighbours(tmp_path, tmp_path / "checkpoints" / "other_job")


def trigger_failed(run: Any) -> bool:
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    return run.state == "failed" and states["trigger_checkpoint"] == "failed"


@pytest.mark.parametrize("linked", ["_staging", "_commits"])
def test_links_in_a_table_fail_the_run_and_change_nothing_outside(
    scene: dict[str, Any],  # noqa: F811
    neighbours: dict[str, Path],
    example_dag: Any,
    linked: str,
) -> None:
    pipeline, table = example_dag.dag, scene["base"] / "marts" / "events"
    original = table / linked
    if original.exists():
        original.rename(table / f".{linked}.saved")
    original.symlink_to(neighbours["table"] / linked)
    events = pd.concat([scene["events"], land_events(scene["base"] / "landing", "e2.json", 80, 62)])
    before = fingerprints(neighbours)
    run = pipeline.test()
    assert run.state == "failed"
    assert fingerprints(neighbours) == before
    findings = audit_job(scene["storage"], 3, example_dag.pipeline.job.graph.sinks)
    assert linked != "_staging" or any("_staging" in f and "owns it" in f for f in findings), findings
    assert fingerprints(neighbours) == before, "the audit follows no link"
    original.unlink()
    if (table / f".{linked}.saved").exists():
        (table / f".{linked}.saved").rename(original)
    assert pipeline.test().state == "success"  # the job recovers once the link is gone
    assert mismatches(scene["base"] / "marts", events) == {}
    assert fingerprints(neighbours) == before


def test_forged_metadata_and_savepoint_targets_fail_the_trigger_before_any_effect(
    scene: dict[str, Any],  # noqa: F811
    neighbours: dict[str, Path],
    example_dag: Any,
    tmp_path: Path,
) -> None:
    pipeline, job_dir = example_dag.dag, tmp_path / "checkpoints" / JOB
    latest = max(int(p.name[4:]) for p in job_dir.glob("chk-*") if (p / "_metadata").exists())
    meta = json.loads((job_dir / f"chk-{latest}" / "_metadata").read_text())
    meta.update(job_id="other_job", checkpoint_id=9, sinks={})
    meta["barrier"]["checkpoint_id"] = 9
    (job_dir / "chk-9").mkdir()
    (job_dir / "chk-9" / "_metadata").write_text(json.dumps(meta))
    own, others = tree(job_dir), fingerprints(neighbours)
    run = pipeline.test()
    assert trigger_failed(run)
    assert (tree(job_dir), fingerprints(neighbours)) == (own, others)
    shutil.rmtree(job_dir / "chk-9")
    own = tree(job_dir)
    for savepoint_dir in (job_dir, neighbours["job"]):  # both lie under the storage root, an allowed root
        run = pipeline.test(run_conf={"savepoint": True, "savepoint_dir": str(savepoint_dir)})
        assert trigger_failed(run), savepoint_dir
        assert (tree(job_dir), fingerprints(neighbours)) == (own, others), savepoint_dir


def test_restore_dag_refuses_a_checkpoint_placed_in_another_jobs_directory(
    scene: dict[str, Any],  # noqa: F811
    neighbours: dict[str, Path],
    restore_dag: Any,
    tmp_path: Path,
) -> None:
    job_dir = tmp_path / "checkpoints" / JOB
    latest = max(int(p.name[4:]) for p in job_dir.glob("chk-*") if (p / "_metadata").exists())
    copied = neighbours["job"] / f"chk-{latest}"
    shutil.copytree(job_dir / f"chk-{latest}", copied, dirs_exist_ok=True)
    own, others = tree(job_dir), fingerprints(neighbours)
    conf = {"job_id": JOB, "checkpoint": str(copied), "trigger_pipeline": False}
    assert restore_dag.dag.test(run_conf=conf).state == "failed"
    assert (tree(job_dir), fingerprints(neighbours)) == (own, others)
    assert not (job_dir / "_restore.json").exists()
