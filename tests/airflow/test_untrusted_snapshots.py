"""Crafted snapshots and restore requests cannot make a worker read, move or delete outside its roots.

A real savepoint of the example pipeline is copied into an allowed savepoint root and its
``_metadata`` (or its files) crafted: sink committables and state handles that escape
with ``..``, absolute paths, other schemes, and symlinks inside the snapshot or the table
that lead outside. Every one is refused — by the restore DAG, and by the pipeline's
trigger when a restore request is forged to bypass the DAG — and a canary directory
outside every root stays byte-for-byte unchanged.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from airflow_provider_checkpoint.core.model import RestoreRequest
from airflow_provider_checkpoint.exceptions import DocumentError, UnsafePathError
from airflow_provider_checkpoint.restore.requests import request_restore
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.storage.job_records import JobRecordStore
from airflow_provider_checkpoint.testing.clickstream import land_events, mismatches

pytestmark = pytest.mark.airflow
JOB = "example_clickstream"
Craft = Callable[[dict[str, Any], Path, Path], None]


def files_of(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() or p.is_symlink()}


def sha256(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def first_handle(meta: dict[str, Any]) -> dict[str, Any]:
    return meta["operators"]["page_views"]["handles"][0]


def first_move(meta: dict[str, Any]) -> list[str]:
    return meta["sinks"]["events_archive"][0]["moves"][0]


def handle_to(target: str, canary_file: Path) -> Craft:
    def craft(meta: dict[str, Any], snapshot: Path, canary: Path) -> None:
        first_handle(meta).update(path=target, size=canary_file.stat().st_size, checksum=sha256(canary_file))

    return craft


def staged_from(staged: str) -> Craft:
    def craft(meta: dict[str, Any], snapshot: Path, canary: Path) -> None:
        first_move(meta)[0] = staged

    return craft


def target_to(target: str) -> Craft:
    def craft(meta: dict[str, Any], snapshot: Path, canary: Path) -> None:
        first_move(meta)[1] = target

    return craft


def uncommitted_output_via_symlink(meta: dict[str, Any], snapshot: Path, canary: Path) -> None:
    """Claims to be checkpoint 2, whose archive output (never committed) is a link in the table's staging."""
    meta["checkpoint_id"] = meta["barrier"]["checkpoint_id"] = 2
    meta["sinks"] = {
        "events_archive": [
            {"checkpoint_id": 2, "moves": [["_staging/chk-2/evil.parquet", "part-c0000000002-00000.parquet"]]}
        ]
    }


def symlinked_state_file(meta: dict[str, Any], snapshot: Path, canary: Path) -> None:
    """A state file replaced by a link to a canary file, its size and checksum forged to match."""
    handle = first_handle(meta)
    (snapshot / handle["path"]).unlink()
    (snapshot / handle["path"]).symlink_to(canary / "secret.parquet")
    handle.update(size=(canary / "secret.parquet").stat().st_size, checksum=sha256(canary / "secret.parquet"))


def symlinked_state_dir(meta: dict[str, Any], snapshot: Path, canary: Path) -> None:
    """The snapshot's state directory of an operator is a link to the canary directory."""
    handle = first_handle(meta)
    state_dir = snapshot / "state" / "page_views"
    shutil.rmtree(state_dir)
    state_dir.symlink_to(canary)
    handle.update(path="state/page_views/secret.parquet")
    handle.update(size=(canary / "secret.parquet").stat().st_size, checksum=sha256(canary / "secret.parquet"))


@pytest.fixture
def scene(example_dag, tmp_path: Path) -> dict[str, Any]:
    """One completed savepoint of the example pipeline, a canary outside every root, and the storage."""
    pipeline, base = example_dag.dag, tmp_path / "clickstream"
    events = land_events(base / "landing", "e1.json", 120, 61)
    assert pipeline.test(run_conf={"savepoint": True}).state == "success"
    (savepoint,) = (tmp_path / "savepoints").glob("savepoint-*")
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "secret.parquet").write_bytes(b"PAR1 not yours PAR1")
    (canary / f"part-c{1:010d}-00000.parquet").write_bytes(b"canary table file")
    storage = JobStorage.for_job(f"file://{tmp_path}/checkpoints", JOB)
    return {"savepoint": savepoint, "canary": canary, "storage": storage, "events": events, "base": base}


def crafted_copy(scene: dict[str, Any], name: str, craft: Craft) -> Path:
    target = scene["savepoint"].parent / name
    shutil.copytree(scene["savepoint"], target, symlinks=True)
    meta = json.loads((target / "_metadata").read_text())
    craft(meta, target, scene["canary"])
    (target / "_metadata").write_text(json.dumps(meta))
    return target


def cases(canary: Path) -> dict[str, Craft]:
    secret = canary / "secret.parquet"
    return {
        "committable staged ../": staged_from("_staging/chk-1/../../../../canary/secret.parquet"),
        "committable staged absolute": staged_from(str(secret)),
        "committable staged other scheme": staged_from("s3://bucket/secret.parquet"),
        "committable target ../": target_to("../../../canary/part-c0000000001-00000.parquet"),
        "committable target absolute": target_to(str(canary / "x.parquet")),
        "committable target in a subdirectory": target_to("sub/part-c0000000001-00000.parquet"),
        "handle ../": handle_to("../../canary/secret.parquet", secret),
        "handle absolute": handle_to(str(secret), secret),
        "handle other scheme": handle_to(f"file://{secret}", secret),
        "handle symlink to a file outside": symlinked_state_file,
        "handle under a symlinked directory": symlinked_state_dir,
    }


def test_crafted_snapshots_are_refused_by_the_restore_dag(scene, restore_dag, tmp_path):
    canary, storage = scene["canary"], scene["storage"]
    job_dir = tmp_path / "checkpoints" / JOB
    watched = (canary, job_dir, scene["base"] / "marts")
    before = {str(root): files_of(root) for root in watched}
    for n, (case, craft) in enumerate(cases(canary).items()):
        crafted = crafted_copy(scene, f"crafted-{n}", craft)
        with pytest.raises((DocumentError, UnsafePathError)) as refused:
            request_restore(storage, f"file://{crafted}", allow_non_restored_state=False, dry_run=True)
        assert "checksum" not in str(refused.value), f"{case}: refused only after reading: {refused.value}"
        with pytest.raises((DocumentError, UnsafePathError)):
            request_restore(storage, f"file://{crafted}", allow_non_restored_state=False, dry_run=False)
        assert not (job_dir / "_restore.json").exists(), case
    for n in (0, 6, 9):  # through the DAG too: the run fails and says why
        conf = {"job_id": JOB, "checkpoint": str(tmp_path / "savepoints" / f"crafted-{n}"), "trigger_pipeline": False}
        assert restore_dag.dag.test(run_conf=conf).state == "failed"
    after = {str(root): files_of(root) for root in watched}
    assert after == before


def test_forged_restore_requests_are_refused_by_the_trigger(scene, example_dag, tmp_path):
    """Bypassing the restore DAG: the trigger validates the snapshot again and moves nothing."""
    pipeline, canary, storage = example_dag.dag, scene["canary"], scene["storage"]
    table = scene["base"] / "marts" / "events"
    # a link inside the table's staging area that leads outside: the shape is right, the target is not
    (table / "_staging" / "chk-2").mkdir(parents=True)
    (table / "_staging" / "chk-2" / "evil.parquet").symlink_to(canary / "secret.parquet")
    forged = {
        "symlink in the table": crafted_copy(scene, "forged-a", uncommitted_output_via_symlink),
        "handle ../": crafted_copy(scene, "forged-b", cases(canary)["handle ../"]),
        "outside every root": None,
    }
    before = files_of(canary)
    for case, snapshot in forged.items():
        location = f"file://{snapshot}" if snapshot else f"file://{canary}"
        JobRecordStore(storage).write_restore_request(RestoreRequest("f" * 32, location, 1, False, 0.0))
        run = pipeline.test()
        states = {ti.task_id: ti.state for ti in run.get_task_instances()}
        assert states["trigger_checkpoint"] == "failed", case
        assert files_of(canary) == before, case
        assert not any(p.is_symlink() for p in table.glob("part-*")), case
    storage.delete("_restore.json")
    shutil.rmtree(table / "_staging")
    land_events(scene["base"] / "landing", "e2.json", 80, 62)
    assert pipeline.test().state == "success"  # the job itself is unharmed
    events = pd.concat([scene["events"], pd.read_json(scene["base"] / "landing" / "e2.json", lines=True)])
    assert mismatches(scene["base"] / "marts", events) == {}
