"""Savepoints and the restore DAG through real Airflow (``dag.test()``) and real Spark.

Every table is compared with a ground truth computed with pandas over all input; state
read back from snapshots is compared with aggregates pandas computes over the input
that snapshot covered.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from airflow_provider_checkpoint.exceptions import CheckpointStorageError
from airflow_provider_checkpoint.restore.requests import read_state, request_restore
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.testing.clickstream import expected_tables, land_events, mismatches, normalized

pytestmark = pytest.mark.airflow
JOB = "example_clickstream"


def metadata(job_dir: Path, checkpoint_id: int) -> dict:
    return json.loads((job_dir / f"chk-{checkpoint_id}" / "_metadata").read_text())


def restore_conf(checkpoint: str, **extra: object) -> dict:
    return {"job_id": JOB, "checkpoint": checkpoint, "trigger_pipeline": False, **extra}


def state_matches(pointer: Path, uid: str, events: pd.DataFrame) -> None:
    table = {"page_views": "page_views", "user_totals": "user_totals"}[uid]
    got = read_state(str(pointer), uid).to_pandas()  # pyarrow only, no Spark
    pd.testing.assert_frame_equal(normalized(got, table), normalized(expected_tables(events)[table], table))


def tree(*roots: Path) -> list[str]:
    return sorted(str(p) for root in roots if root.exists() for p in root.rglob("*"))


def test_moved_savepoint_restores_exactly_once(example_dag, restore_dag, tmp_path):
    pipeline, base = example_dag.dag, tmp_path / "clickstream"
    job_dir = tmp_path / "checkpoints" / JOB
    landed = [land_events(base / "landing", "e1.json", 300, 1)]
    assert pipeline.test().state == "success"
    landed.append(land_events(base / "landing", "e2.json", 200, 2))
    run = pipeline.test(run_conf={"savepoint": True, "savepoint_dir": None, "stop_after_savepoint": False})
    assert run.state == "success"
    (savepoint,) = (tmp_path / "savepoints").glob("savepoint-exampl-*")
    meta = json.loads((savepoint / "_metadata").read_text())
    assert meta["type"] == "savepoint" and meta["relocatable"] and meta["checkpoint_id"] == 2
    assert all(not h["path"].startswith("/") for op in meta["operators"].values() for h in op["handles"])
    state_matches(savepoint, "page_views", pd.concat(landed))

    landed.append(land_events(base / "landing", "e3.json", 250, 3))
    assert pipeline.test().state == "success"
    moved = tmp_path / "moved" / "release-1.4"
    moved.parent.mkdir()
    shutil.move(str(savepoint), str(moved))
    assert not savepoint.exists()

    assert restore_dag.dag.test(run_conf=restore_conf(str(moved))).state == "success"
    assert (job_dir / "_restore.json").exists()
    landed.append(land_events(base / "landing", "e4.json", 150, 4))
    assert pipeline.test().state == "success"

    restored = metadata(job_dir, 4)
    assert restored["restored_from"] == 2 and restored["checkpoint_id"] == 4
    assert not (job_dir / "_restore.json").exists()
    assert mismatches(base / "marts", pd.concat(landed)) == {}  # e3 replayed once, not twice
    state_matches(job_dir / "chk-4", "user_totals", pd.concat(landed))


def test_restore_older_checkpoint_rolls_back_state_and_positions(example_dag, restore_dag, tmp_path):
    pipeline, base = example_dag.dag, tmp_path / "clickstream"
    job_dir = tmp_path / "checkpoints" / JOB
    landed = []
    for i in range(1, 4):
        landed.append(land_events(base / "landing", f"e{i}.json", 200, 10 + i))
        assert pipeline.test().state == "success"
    state_matches(job_dir / "chk-1", "user_totals", landed[0])

    assert restore_dag.dag.test(run_conf=restore_conf("1")).state == "success"
    assert pipeline.test().state == "success"
    meta = metadata(job_dir, 4)
    assert meta["restored_from"] == 1 and meta["checkpoint_id"] == 4
    assert meta["stats"]["records_in"] == 400, "checkpoint 4 replays e2 and e3 from checkpoint 1's positions"
    assert mismatches(base / "marts", pd.concat(landed)) == {}
    state_matches(job_dir / "chk-4", "page_views", pd.concat(landed))


def test_stop_with_savepoint_skips_until_restored(example_dag, restore_dag, tmp_path):
    pipeline, base = example_dag.dag, tmp_path / "clickstream"
    job_dir = tmp_path / "checkpoints" / JOB
    landed = [land_events(base / "landing", "e1.json", 100, 21)]
    run = pipeline.test(run_conf={"savepoint": True, "stop_after_savepoint": True})
    assert run.state == "success"
    assert json.loads((job_dir / "_job.json").read_text())["status"] == "STOPPED"

    landed.append(land_events(base / "landing", "e2.json", 100, 22))
    skipped = pipeline.test()
    states = {ti.task_id: ti.state for ti in skipped.get_task_instances()}
    assert states["trigger_checkpoint"] == "skipped" and states["finalize_checkpoint"] == "skipped"
    assert sorted(p.name for p in job_dir.glob("chk-*")) == ["chk-1"]

    assert restore_dag.dag.test(run_conf=restore_conf("latest")).state == "success"
    assert json.loads((job_dir / "_job.json").read_text())["status"] == "RUNNING"
    assert pipeline.test().state == "success"
    assert mismatches(base / "marts", pd.concat(landed)) == {}


def test_snapshot_with_state_for_a_removed_operator(example_dag, restore_dag, tmp_path):
    """A pipeline version without ``user_totals`` must not silently drop that state."""
    pipeline, base = example_dag.dag, tmp_path / "clickstream"
    job_dir = tmp_path / "checkpoints" / JOB
    land_events(base / "landing", "e1.json", 100, 31)
    assert pipeline.test().state == "success"
    storage = JobStorage.for_job(f"file://{tmp_path}/checkpoints", JOB)
    job = json.loads((job_dir / "_job.json").read_text())
    job["topology"]["nodes"].pop("user_totals")  # what the trigger of the new version records
    (job_dir / "_job.json").write_text(json.dumps(job))

    with pytest.raises(ValueError, match="state for operator 'user_totals'.*allow_non_restored_state"):
        request_restore(storage, storage.url("chk-1"), allow_non_restored_state=False, dry_run=False)
    assert restore_dag.dag.test(run_conf=restore_conf("1")).state == "failed"
    assert not (job_dir / "_restore.json").exists()

    dry = request_restore(storage, storage.url("chk-1"), allow_non_restored_state=True, dry_run=True)
    assert dry["operators_dropped"] == ["user_totals"] and not (job_dir / "_restore.json").exists()
    assert restore_dag.dag.test(run_conf=restore_conf("1", allow_non_restored_state=True)).state == "success"
    assert json.loads((job_dir / "_restore.json").read_text())["allow_non_restored_state"] is True


def test_missing_or_corrupt_snapshot_file_is_named(example_dag, restore_dag, tmp_path):
    pipeline, base = example_dag.dag, tmp_path / "clickstream"
    job_dir = tmp_path / "checkpoints" / JOB
    land_events(base / "landing", "e1.json", 100, 41)
    assert pipeline.test(run_conf={"savepoint": True}).state == "success"
    (savepoint,) = (tmp_path / "savepoints").glob("savepoint-*")
    storage = JobStorage.for_job(f"file://{tmp_path}/checkpoints", JOB)
    victim = sorted((savepoint / "state" / "page_views").glob("*.parquet"))[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    with pytest.raises(CheckpointStorageError, match=f"checksum mismatch for file://{victim}"):
        request_restore(storage, f"file://{savepoint}", False, False)
    victim.unlink()
    with pytest.raises(CheckpointStorageError, match=f"state file missing: file://{victim}"):
        request_restore(storage, f"file://{savepoint}/_metadata", False, False)
    assert restore_dag.dag.test(run_conf=restore_conf(str(savepoint))).state == "failed"
    assert not (job_dir / "_restore.json").exists()


def test_unsafe_paths_are_refused_and_write_nothing(example_dag, restore_dag, tmp_path):
    pipeline, base = example_dag.dag, tmp_path / "clickstream"
    land_events(base / "landing", "e1.json", 50, 51)
    assert pipeline.test().state == "success"
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "savepoints").mkdir(exist_ok=True)
    (tmp_path / "savepoints" / "escape").symlink_to(outside)
    watched = (tmp_path / "checkpoints", tmp_path / "savepoints", tmp_path / "moved", outside, base / "marts")
    before = tree(*watched)

    for bad in (
        f"{tmp_path}/savepoints/../outside",
        str(outside),
        f"{tmp_path}/savepoints/escape",
        "s3://bucket/savepoints",
        f"file://otherhost{tmp_path}/savepoints",
        "relative/dir",
    ):
        run = pipeline.test(run_conf={"savepoint": True, "savepoint_dir": bad})
        assert run.state == "failed", bad
    for bad in ("../../etc", "/etc/passwd", f"{tmp_path}/savepoints/escape", "s3://bucket/sp", "latest/../x"):
        assert restore_dag.dag.test(run_conf=restore_conf(bad)).state == "failed", bad
    assert tree(*watched) == before
