"""Probe: write access to one job's or one table's directory gives no effect outside it.

Each test crafts a symlink, a document or a savepoint target in the job's own directories,
runs the consumer (trigger recovery, finalize commit and abort, restore, clean_source,
retention, audit) and asserts that it is refused with an error naming the path and the
rule, and that every file and directory of the neighbours — another table, another job,
an outside directory — is unchanged (and, for identity checks, the job's own directory).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from airflow_provider_checkpoint.core.model import CheckpointType, RestoreRequest
from airflow_provider_checkpoint.exceptions import RefusedInputError, UnsafePathError
from airflow_provider_checkpoint.jobs.audit import audit_job
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore
from airflow_provider_checkpoint.storage.job_records import JobRecordStore
from airflow_provider_checkpoint.storage.paths import resolve_under_roots
from airflow_provider_checkpoint.testing.neighbours import fingerprints, plant_neighbours, tree
from tests.unit.helpers import JOB, T0, Env, make_ack, make_env, run_checkpoint

OUTSIDE_RULE = "outside the directory that owns it"


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    monkeypatch.delenv("CHECKPOINT_FAULTS", raising=False)
    return make_env(tmp_path)


@pytest.fixture
def neighbours(env: Env) -> dict[str, Path]:
    return plant_neighbours(env.root, env.root / "ckpt" / "other_job")


def link(path: Path, target: Path) -> None:
    """Replace ``path`` (a file or directory, or nothing) with a symlink to ``target``."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


def refused(error: pytest.ExceptionInfo[BaseException], path: str, rule: str = OUTSIDE_RULE) -> None:
    message = str(error.value)
    assert path in message and rule in message, message


# -- 1. symlinks in a table's directories ----------------------------------------------------
def test_abandoned_checkpoint_cleanup_does_not_follow_a_symlinked_staging(env: Env, neighbours) -> None:
    env.coordinator.trigger("run-1", now=T0)
    JobRecordStore(env.storage).release_lease("run-1")  # its run died: the next trigger aborts checkpoint 1
    link(env.table / "_staging", neighbours["table"] / "_staging")
    before = fingerprints(neighbours)
    with pytest.raises(UnsafePathError) as error:
        env.coordinator.trigger("run-2", now=T0 + 10)
    refused(error, "_staging/chk-1")
    assert fingerprints(neighbours) == before


def test_finalize_abort_does_not_follow_a_symlinked_staging(env: Env, neighbours) -> None:
    plan = env.coordinator.trigger("run-1", now=T0)
    link(env.table / "_staging", neighbours["table"] / "_staging")
    before = fingerprints(neighbours)
    with pytest.raises(UnsafePathError) as error:
        env.coordinator.finalize(plan, [None], now=T0 + 1)
    refused(error, "_staging/chk-1")
    assert fingerprints(neighbours) == before


@pytest.mark.parametrize(("linked", "to"), [("_commits", "table"), ("_rolled_back", "table"), ("_commits", "outside")])
def test_finalize_commit_does_not_follow_symlinked_table_directories(env: Env, neighbours, linked, to) -> None:
    plan = env.coordinator.trigger("run-1", now=T0)
    ack = make_ack(env, plan)
    target = neighbours[to] / linked if to == "table" else neighbours[to]
    link(env.table / linked, target)
    before = fingerprints(neighbours)
    with pytest.raises(UnsafePathError) as error:
        env.coordinator.finalize(plan, [ack], now=T0 + 1)
    refused(error, linked)
    assert fingerprints(neighbours) == before


@pytest.mark.parametrize(
    ("linked", "to"), [("_commits", "table"), ("_rolled_back", "table"), ("_rolled_back", "outside")]
)
def test_restore_does_not_follow_symlinked_table_directories(env: Env, neighbours, linked, to) -> None:
    for i in range(3):
        run_checkpoint(env, f"run-{i}", T0 + 10 * i)
    JobRecordStore(env.storage).write_restore_request(RestoreRequest("a" * 32, env.storage.url("chk-1"), 1, False, T0))
    target = neighbours[to] / linked if to == "table" else neighbours[to]
    link(env.table / linked, target)
    before = fingerprints(neighbours)
    with pytest.raises(UnsafePathError) as error:
        env.coordinator.trigger("run-restore", now=T0 + 100)
    refused(error, linked)
    assert fingerprints(neighbours) == before


# -- 1. symlinks in a landing or archive directory ---------------------------------------------
def test_clean_source_archive_does_not_move_into_a_symlinked_archive_subdirectory(tmp_path: Path) -> None:
    env = make_env(tmp_path, clean_source="archive", archive_dir=str(tmp_path / "archive"))
    outside = plant_neighbours(tmp_path, tmp_path / "ckpt" / "other_job")["outside"]
    (env.landing / "sub").mkdir()
    (env.landing / "sub" / "b.json").write_bytes(b'{"k": 2}\n')
    link(tmp_path / "archive" / "sub", outside)
    before = tree(outside)
    with pytest.raises(UnsafePathError) as error:
        run_checkpoint(env, "run-1", T0)
    refused(error, "sub/b.json")
    assert tree(outside) == before
    assert (env.landing / "sub" / "b.json").exists()


def test_clean_source_delete_ignores_links_in_the_landing_directory(tmp_path: Path) -> None:
    env = make_env(tmp_path, clean_source="delete")
    outside = plant_neighbours(tmp_path, tmp_path / "ckpt" / "other_job")["outside"]
    link(env.landing / "sub", outside)
    link(env.landing / "linked.json", outside / "secret.json")
    before = tree(outside)
    plan, _ = run_checkpoint(env, "run-1", T0)
    assert plan.barrier.positions["events"]["files"] == {"a.json": 9}, "links are neither listed nor read"
    assert tree(outside) == before
    assert not (env.landing / "a.json").exists(), "the job's own file is cleaned"


# -- 1. symlinks in the job directory --------------------------------------------------------
@pytest.mark.parametrize("linked", ["_stats", "chk-1"])
def test_job_directory_links_are_refused(env: Env, neighbours, linked) -> None:
    target = {"_stats": neighbours["job"] / "_stats", "chk-1": neighbours["job"] / "chk-1"}[linked]
    env.job_dir.mkdir(parents=True)
    link(env.job_dir / linked, target)
    before = fingerprints(neighbours)
    with pytest.raises(UnsafePathError) as error:
        run_checkpoint(env, "run-1", T0)
    refused(error, linked)
    assert fingerprints(neighbours) == before


def test_audit_reports_links_out_and_changes_nothing(env: Env, neighbours) -> None:
    run_checkpoint(env, "run-1", T0)
    link(env.job_dir / "chk-7", neighbours["job"] / "chk-1")
    link(env.table / "_staging", neighbours["table"] / "_staging")
    before = fingerprints(neighbours)
    findings = audit_job(env.storage, 3, env.coordinator.graph.sinks)
    assert any("chk-7" in f and OUTSIDE_RULE in f for f in findings), findings
    assert any("_staging" in f and OUTSIDE_RULE in f for f in findings), findings
    assert not any("other_job" in f and "orphaned" in f for f in findings), findings
    assert fingerprints(neighbours) == before


# -- 2. identity before the first effect -------------------------------------------------------
def forge(env: Env, into: int, **changes: object) -> None:
    """``chk-<into>/_metadata``: a copy of the latest checkpoint's with ``changes``, without sink output."""
    latest = CompletedCheckpointStore(env.storage).completed_ids()[-1]
    meta = json.loads((env.chk(latest) / "_metadata").read_bytes())
    meta.update(sinks={}, **changes)
    meta["barrier"]["checkpoint_id"] = meta["checkpoint_id"]
    env.chk(into).mkdir(exist_ok=True)
    (env.chk(into) / "_metadata").write_text(json.dumps(meta))


FORGERIES = {
    "another job": ({"job_id": "other_job", "checkpoint_id": 9}, "belongs to job 'other_job'"),
    "another id than its directory": ({}, "is checkpoint 4, not 9"),
    "a relocatable savepoint": ({"checkpoint_id": 9, "relocatable": True, "operators": {}}, "relocatable"),
    "incompatible operators": ({"checkpoint_id": 9, "keys": ["x"]}, "keyed by"),
}


@pytest.mark.parametrize("case", FORGERIES)
def test_trigger_checks_a_forged_latest_checkpoint_before_recovery(env: Env, neighbours, case) -> None:
    for i in range(4):  # retained 3: chk-2, chk-3, chk-4
        run_checkpoint(env, f"run-{i}", T0 + 10 * i)
    changes, rule = FORGERIES[case]
    if "keys" in changes:
        meta = json.loads((env.chk(4) / "_metadata").read_bytes())
        meta["operators"]["counts"]["keys"] = changes.pop("keys")
        changes["operators"] = meta["operators"]
    forge(env, 9, **changes)
    before, table = tree(env.job_dir), tree(env.table)
    with pytest.raises(RefusedInputError) as error:
        env.coordinator.trigger("run-x", now=T0 + 100)
    refused(error, "chk-9", rule)
    assert tree(env.job_dir) == before, "no sink commit, retention or stats before the refusal"
    assert tree(env.table) == table


def test_finalize_checks_an_existing_metadata_before_finishing(env: Env, neighbours) -> None:
    for i in range(3):
        run_checkpoint(env, f"run-{i}", T0 + 10 * i)
    plan = env.coordinator.trigger("run-4", now=T0 + 100)
    ack = make_ack(env, plan)
    forge(env, 4, job_id="other_job", checkpoint_id=4)
    before, table = tree(env.job_dir), tree(env.table)
    with pytest.raises(RefusedInputError) as error:
        env.coordinator.finalize(plan, [ack], now=T0 + 101)
    refused(error, "chk-4", "belongs to job 'other_job'")
    before.pop("_lease")
    assert tree(env.job_dir) == before, "no sink commit, retention or stats before the refusal"
    assert tree(env.table) == table


def test_finalize_refuses_a_plan_of_another_job(env: Env, neighbours) -> None:
    plan = env.coordinator.trigger("run-1", now=T0)
    forged = plan.__class__.from_dict({**plan.to_dict(), "job_id": "other_job"})
    ack = make_ack(env, plan)
    before = tree(env.job_dir)
    with pytest.raises(RefusedInputError) as error:
        env.coordinator.finalize(forged, [ack], now=T0 + 1)
    refused(error, "other_job", "not job 'job'")
    assert tree(env.job_dir) == before


# -- 3. savepoint targets ---------------------------------------------------------------------
def savepoint_targets(root: Path) -> dict[str, tuple[Path, str]]:
    """Crafted targets inside allowed roots, and the rule each breaks."""
    (root / "savepoints" / "used").mkdir(parents=True)
    (root / "savepoints" / "used" / "_metadata").write_text("{}")
    (root / "savepoints" / "copied_job" / "deep").mkdir(parents=True)
    (root / "savepoints" / "copied_job" / "_job.json").write_text("{}")
    return {
        "another job's checkpoint": (root / "ckpt" / "other_job" / "chk-9", "a job's checkpoint tree"),
        "inside another job's directory": (root / "ckpt" / "other_job" / "sp", "a job's checkpoint tree"),
        "inside this job's directory": (root / "ckpt" / JOB / "sp", "a job's checkpoint tree"),
        "a used directory": (root / "savepoints" / "used", "must be new or empty"),
        "under a job record": (root / "savepoints" / "copied_job" / "deep" / "sp", "a job's checkpoint tree"),
        "under a chk directory": (root / "savepoints" / "chk-3" / "sp", "a job's checkpoint tree"),
    }


def test_trigger_refuses_savepoint_targets_in_a_checkpoint_tree(env: Env, neighbours) -> None:
    run_checkpoint(env, "run-0", T0)
    for case, (target, rule) in savepoint_targets(env.root).items():
        before, others = tree(env.job_dir), fingerprints(neighbours)
        with pytest.raises(UnsafePathError) as error:
            env.coordinator.trigger(
                "run-sp", CheckpointType.SAVEPOINT, T0 + 10, {"savepoint_target": f"file://{target}"}
            )
        refused(error, str(target), rule)
        assert (tree(env.job_dir), fingerprints(neighbours)) == (before, others), case


def test_finalize_checks_the_savepoint_target_again_before_writing(env: Env, neighbours) -> None:
    target = env.root / "savepoints" / "fresh"
    plan = env.coordinator.trigger("run-sp", CheckpointType.SAVEPOINT, T0, {"savepoint_target": f"file://{target}"})
    ack = make_ack(env, plan)
    link(target, neighbours["job"] / "chk-1")  # after the trigger's check: now another job's checkpoint
    before = fingerprints(neighbours)
    with pytest.raises(RefusedInputError) as error:
        env.coordinator.finalize(plan, [ack], now=T0 + 1)
    refused(error, "fresh", "a job's checkpoint tree")
    assert fingerprints(neighbours) == before
    assert not CompletedCheckpointStore(env.storage).is_completed(plan.checkpoint_id)


def test_a_refused_savepoint_target_never_repeats_its_credentials(env: Env) -> None:
    """Issue #52: the refusal names the target with its userinfo and secret query values redacted."""
    run_checkpoint(env, "run-0", T0)
    for target in ("s3://AKIA:sekret@bucket/savepoints/x", f"file://AKIA:sekret@{env.root}/savepoints/x"):
        with pytest.raises(UnsafePathError) as error:
            env.coordinator.trigger("run-sp", CheckpointType.SAVEPOINT, T0 + 10, {"savepoint_target": target})
        assert "savepoint_target" in str(error.value) and "***@" in str(error.value), target
        assert "sekret" not in str(error.value) and "AKIA" not in str(error.value), target
    with pytest.raises(UnsafePathError) as error:  # an allowed root configured with credentials
        resolve_under_roots("s3://bucket/elsewhere", ["s3://AKIA:sekret@bucket/savepoints"])
    assert "sekret" not in str(error.value) and "s3://***@bucket/savepoints" in str(error.value)
