"""Crafted stored documents and inputs are refused with a clear message, never a traceback.

One real savepoint run of the example pipeline, then each probe crafts one document (or
passes one crafted input) and drives its consumers: ``airflow checkpoints …`` through
Airflow's own parser, the trigger task, the sensors and the restore action. Each asserts
the refusal the consumer owes (CLI exit 2 with the document, field and rule on stderr; an
Airflow failure without retry; an informational document shown as unreadable, not a
crash) and that the consumers changed nothing: every file under the test's directory is
hashed before and after.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_checkpoint.sensors.checkpoint import CheckpointCompletedSensor, CheckpointInputSensor
from airflow_provider_checkpoint.testing.clickstream import land_events
from tests.airflow.conftest import cli, load_dag_module
from tests.conftest import REPO

pytestmark = pytest.mark.airflow
JOB = "example_clickstream"
DEEP = b"[" * 100_000 + b"]" * 100_000


def hashes(root: Path) -> dict[str, str]:
    return {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
        if not p.name.startswith(".")
    }


@contextmanager
def crafted(root: Path, writes: dict[Path, bytes]) -> Iterator[None]:
    """Write ``writes``; the block must change nothing else under ``root``; then undo them."""
    saved = {path: path.read_bytes() if path.exists() else None for path in writes}
    for path, data in writes.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    before = hashes(root)
    yield
    assert hashes(root) == before, "a refused document or input changed files"
    for path, data in saved.items():
        if data is None:
            path.unlink()
        else:
            path.write_bytes(data)


def edited(path: Path, **fields: Any) -> bytes:
    return json.dumps({**json.loads(path.read_bytes()), **fields}).encode()


@pytest.fixture(scope="module")
def scene(airflow_db: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """The example DAG after one completed savepoint run, shared by every probe (each undoes its craft)."""
    tmp_path = tmp_path_factory.mktemp("probes")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CLICKSTREAM_DIR", str(tmp_path / "clickstream"))
        patch.setenv("AIRFLOW__CHECKPOINT__STORAGE_ROOT", f"file://{tmp_path}/checkpoints")
        patch.setenv("AIRFLOW__CHECKPOINT__SAVEPOINT_ROOTS", f"file://{tmp_path}/savepoints")
        module = load_dag_module(REPO / "dags" / "example_clickstream.py")
        land_events(tmp_path / "clickstream" / "landing", "e1.json", 60, 71)
        assert module.dag.test(run_conf={"savepoint": True}).state == "success"
        yield module, tmp_path


@pytest.fixture
def job(scene: tuple[Any, Path]) -> Path:
    return scene[1] / "checkpoints" / JOB


@pytest.fixture
def tmp(scene: tuple[Any, Path]) -> Path:
    return scene[1]


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code, _, err = cli(capsys, *argv)
    assert code == 2 and "Traceback" not in err, (argv, code, err)
    return err


def shown(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code, out, err = cli(capsys, *argv, "--output", "json")
    assert code == 0, (argv, err)
    return json.loads(out)


def test_restore_ids_and_paths_are_refused_clearly(job, tmp, capsys):
    with crafted(tmp, {}):
        assert "must be absolute" in refused(capsys, "restore", JOB, "--checkpoint", "²")
        assert "larger than any checkpoint id" in refused(capsys, "restore", JOB, "--checkpoint", "9" * 5000)
        assert "has no completed checkpoint 7" in refused(capsys, "restore", JOB, "--checkpoint", "7")
        assert "is not a job id" in refused(capsys, "history", "../x")


def test_a_savepoint_committable_escaping_its_staging_is_refused(job, tmp, capsys):
    (savepoint,) = (tmp / "savepoints").glob("savepoint-*")
    meta = json.loads((savepoint / "_metadata").read_bytes())
    meta["sinks"]["events_archive"][0]["moves"][0][0] = "_staging/chk-1/../../../../canary/x.parquet"
    with crafted(tmp, {savepoint / "_metadata": json.dumps(meta).encode()}):
        err = refused(capsys, "restore", JOB, "--checkpoint", str(savepoint), "--dry-run")
        assert (
            err.startswith("restore refused: ")
            and "sinks.events_archive[0].moves[0][0]" in err
            and "not normalized" in err
        )


@pytest.mark.parametrize(
    "stats",
    [b"[1, 2]", DEEP, b'{"checkpoint_id": 1, "status": "COMPLETED", "trigger_time": 1e14, "end_time": 1e300}'],
    ids=["a JSON list", "deeply nested", "times past year 9999"],
)
def test_unreadable_stats_are_shown_as_unknown(job, tmp, capsys, stats):
    with crafted(tmp, {job / "_stats" / "1.json": stats}):
        rows = shown(capsys, "history", JOB)
        assert all(r["trigger_time"] is None for r in rows if r["checkpoint_id"] == 1), rows
        detail = shown(capsys, "show", JOB, "1")
        assert detail["checkpoint_id"] == 1 and detail["operators"]["page_views"]["rows"] > 0
        code, out, _ = cli(capsys, "history", JOB)  # the table form formats every time it shows
        assert code == 0
        sensor = CheckpointCompletedSensor(
            task_id="wait", job_id=JOB, storage=f"file://{tmp}/checkpoints", after_checkpoint_id=0
        )
        sensor._after = 0
        assert sensor.poke({}) is False or stats.startswith(b"{"), "unreadable stats never count as committed"


@pytest.mark.parametrize(
    ("entry", "rule"),
    [
        (DEEP, "is not valid JSON"),
        (
            b'{"version": 1, "job_id": "example_clickstream", "dag_id": "example_clickstream", '
            b'"storage_root": "nosuch://bucket/root"}',
            "no filesystem serves 'nosuch://bucket/root",
        ),
    ],
    ids=["deeply nested", "a scheme no filesystem serves"],
)
def test_a_crafted_registry_entry_is_refused(job, tmp, capsys, entry, rule):
    registry = tmp / "checkpoints" / "_registry" / f"{JOB}.json"
    with crafted(tmp, {registry: entry}):
        assert rule in refused(capsys, "history", JOB)
        listed = {r["job_id"]: r for r in shown(capsys, "list")}
        assert JOB in listed  # skipped entry: the job is still found under the default root, or shown unreadable
        assert listed[JOB]["status"] in ("RUNNING", "UNREADABLE")


def test_a_job_record_with_an_impossible_time_is_refused(job, tmp, capsys):
    record = json.loads((job / "_job.json").read_bytes())
    record["savepoints"][0]["time"] = 1e14
    with crafted(tmp, {job / "_job.json": json.dumps(record).encode()}):
        (row,) = [r for r in shown(capsys, "list") if r["job_id"] == JOB]
        assert row["status"] == "UNREADABLE" and "time" in row["status_reason"]
        assert "savepoints" in refused(capsys, "restore", JOB, "--checkpoint", "latest", "--dry-run")
        sensor = CheckpointCompletedSensor(
            task_id="wait", job_id=JOB, storage=f"file://{tmp}/checkpoints", savepoint=True
        )
        sensor._after = 0
        with pytest.raises(AirflowFailException, match="_job.json"):
            sensor.poke({})


def test_a_source_position_leaving_the_landing_directory_fails_the_trigger(job, scene, tmp):
    meta_path = job / "chk-1" / "_metadata"
    meta = json.loads(meta_path.read_bytes())
    positions = meta["barrier"]["positions"] if "positions" in meta["barrier"] else meta["source_positions"]
    positions["events"]["files"] = {"../outside.json": 10}
    example_dag, _ = scene
    watched = tmp / "clickstream"
    before = hashes(watched)
    shutil.copy(meta_path, tmp / "metadata.bak")
    meta_path.write_text(json.dumps(meta))
    sensor = CheckpointInputSensor(task_id="wait", job=example_dag.pipeline.job)
    with pytest.raises(AirflowFailException, match=r"file name '\.\./outside\.json'"):
        sensor.poke({})
    run = example_dag.dag.test()
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states["trigger_checkpoint"] == "failed" and not (job / "chk-2" / "_metadata").exists()
    assert hashes(watched) == before
