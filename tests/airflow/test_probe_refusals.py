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
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_checkpoint.sensors.checkpoint import CheckpointCompletedSensor, CheckpointInputSensor
from airflow_provider_checkpoint.testing.clickstream import land_events
from tests.airflow.conftest import checkpoints_client, cli, load_dag_module
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
            "storage_root 'nosuch://bucket/root' has scheme 'nosuch', which the provider does not open",
        ),
    ],
    ids=["deeply nested", "a scheme the provider does not serve"],
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


SECRET = "planted-registry-secret-3e9a"


def registry_entry(tmp: Path, storage_root: str) -> dict[Path, bytes]:
    """A crafted registry entry of the job naming ``storage_root`` (for :func:`crafted`)."""
    entry = {"version": 1, "job_id": JOB, "dag_id": JOB, "storage_root": storage_root}
    return {tmp / "checkpoints" / "_registry" / f"{JOB}.json": json.dumps(entry).encode()}


def api(method: str, endpoint: str, body: dict[str, Any] | None = None) -> tuple[int, str]:
    """``<method> /checkpoints/api/<endpoint>`` through Airflow's API app as an admin: (status, body)."""
    client, headers = checkpoints_client()
    response = client.request(method, f"/checkpoints/api/{endpoint}", headers=headers, json=body)
    return response.status_code, response.text


def test_a_registry_url_with_credentials_is_refused_and_its_secret_never_shown(job, tmp, capsys, caplog):
    with crafted(tmp, registry_entry(tmp, f"s3://AKIAPROBE:{SECRET}@127.0.0.1:9/root")):
        outputs = [refused(capsys, "history", JOB), refused(capsys, "restore", JOB, "--checkpoint", "latest")]
        assert all("storage_root 's3://***@127.0.0.1:9/root' carries a password" in err for err in outputs), outputs
        for output in ("table", "plain", "json", "yaml"):
            code, out, err = cli(capsys, "list", "--output", output)
            assert code == 0, err
            outputs += [out, err]
        status, body = api("POST", f"dags/{JOB}/restore", {"checkpoint": "latest", "dry_run": True})
        assert status == 400 and "carries a password" in body, body
        outputs += [body, *(api("GET", endpoint)[1] for endpoint in ("jobs", f"dags/{JOB}/status"))]
    assert not [o for o in outputs if SECRET in o] and SECRET not in caplog.text


def test_untrusted_text_is_shown_not_read_as_markup(job, tmp, capsys):
    with crafted(tmp, registry_entry(tmp, f"file://{tmp}/elsewhere/[/bold]")):
        code, out, err = cli(capsys, "list")
        assert code == 0 and "[/bold]" in out, err


def test_a_registry_url_of_a_scheme_not_served_is_refused_before_any_connection(job, tmp, capsys):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.setblocking(False)
        with crafted(tmp, registry_entry(tmp, f"ftp://127.0.0.1:{listener.getsockname()[1]}/root")):
            assert "has scheme 'ftp', which the provider does not open" in refused(capsys, "history", JOB)
            status, body = api("POST", f"dags/{JOB}/restore", {"checkpoint": "latest", "dry_run": True})
            assert status == 400 and "[checkpoint] storage_schemes" in body, body
            assert api("GET", "jobs")[0] == 200
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected


@pytest.mark.parametrize("checkpoint", ["1 ", "latest\n", " latest"])
def test_the_page_refuses_a_checkpoint_with_surrounding_whitespace(job, tmp, checkpoint):
    with crafted(tmp, {}):
        status, body = api("POST", f"dags/{JOB}/restore", {"checkpoint": checkpoint, "dry_run": True})
        assert status == 400 and "surrounding whitespace" in body, body
        assert api("POST", f"dags/{JOB}/restore", {"checkpoint": checkpoint.strip(), "dry_run": True})[0] == 200
