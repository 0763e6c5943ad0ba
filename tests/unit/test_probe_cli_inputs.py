"""Untrusted URLs and CLI inputs that need no Airflow DB: redaction, served schemes, CLI arguments, ``-o json``.

Each probe crafts the input and calls the real consumer: the storage opener, a registry
entry's decoder, Airflow's own CLI parser, the ``airflow`` CLI in a subprocess.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from airflow_provider_checkpoint.exceptions import RefusedInputError, RegistryError, redact, shorten
from airflow_provider_checkpoint.jobs.registry import decode_entry
from airflow_provider_checkpoint.storage.config import storage_location
from tests.conftest import REPO

SECRET = "planted-url-secret-7c2d"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (f"s3://AKIAKEY:{SECRET}@host/root", "s3://***@host/root"),
        (f"s3://AKIAKEY:{SECRET[:8]}/{SECRET[8:]}@host/x and more", "s3://***@host/x and more"),
        (f"cannot reach 's3://k:{SECRET}@b/p' (x)", "cannot reach 's3://***@b/p' (x)"),
        (f"https://h/p?X-Amz-Signature={SECRET}&part=1", "https://h/p?X-Amz-Signature=***&part=1"),
        (f"gs://b/p?sig={SECRET};token={SECRET}#f", "gs://b/p?sig=***;token=***#f"),
        ("file:///data/checkpoints/job", "file:///data/checkpoints/job"),
    ],
    ids=["userinfo", "secret with a slash", "quoted", "signed query", "SAS query", "plain"],
)
def test_redact_hides_url_credentials(text, shown):
    assert redact(text) == shown
    assert SECRET not in shorten(text + "x" * 200), "redacted before it is cut"


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP port on loopback that records whether anything connected to it."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.setblocking(False)
        yield server


def _connected(server: socket.socket) -> bool:
    try:
        server.accept()[0].close()
    except BlockingIOError:
        return False
    return True


def test_a_scheme_the_provider_does_not_serve_is_refused_before_any_connection(listener):
    port = listener.getsockname()[1]
    with pytest.raises(RefusedInputError, match="has scheme 'ftp', which the provider does not open"):
        storage_location(f"ftp://127.0.0.1:{port}/root")
    entry = {"version": 1, "job_id": "j", "dag_id": "j", "storage_root": f"ftp://127.0.0.1:{port}/root"}
    with pytest.raises(RegistryError, match=r"_registry/j\.json: storage_root 'ftp://.*\[checkpoint\] storage_schemes"):
        decode_entry(json.dumps(entry).encode(), "_registry/j.json", "j")
    assert not _connected(listener), "the refused URL was opened"


def test_a_scheme_registered_in_storage_schemes_is_accepted(monkeypatch):
    monkeypatch.setenv("AIRFLOW__CHECKPOINT__STORAGE_SCHEMES", "ftp, gs")
    entry = {"version": 1, "job_id": "j", "dag_id": "j", "storage_root": "ftp://127.0.0.1:9/root"}
    assert decode_entry(json.dumps(entry).encode(), "j.json", "j").storage_root == "ftp://127.0.0.1:9/root"


def test_a_storage_url_carrying_a_password_is_refused_redacted(caplog):
    url = f"s3://AKIAKEY:{SECRET}@127.0.0.1:9/root"
    with pytest.raises(RefusedInputError, match=r"'s3://\*\*\*@127.0.0.1:9/root' carries a password") as refused:
        storage_location(url)
    entry = {"version": 1, "job_id": "j", "dag_id": "j", "storage_root": url}
    with pytest.raises(RegistryError, match="carries a password") as registry:
        decode_entry(json.dumps(entry).encode(), "j.json", "j")
    assert SECRET not in str(refused.value) + str(registry.value) + caplog.text


@pytest.mark.parametrize("argv", [["--offset", "-5"], ["--limit", "0"], ["--limit", "-1"], ["--offset", "x"]])
def test_history_refuses_a_negative_offset_or_limit_at_parsing(capsys, argv):
    from airflow.cli import cli_parser

    with pytest.raises(SystemExit) as exited:
        cli_parser.get_parser().parse_args(["checkpoints", "history", "some_job", *argv])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "Traceback" not in err and f"argument {argv[0]}" in err


def test_json_output_is_only_json_while_a_provider_logs(tmp_path):
    """``airflow checkpoints list -o json`` in a real process: the Amazon provider logs at INFO
    ("credentials retrieved") while the job's ``aws`` connection is resolved; that line must go
    to stderr and stdout must parse as JSON."""
    registry = tmp_path / "checkpoints" / "_registry"
    registry.mkdir(parents=True)
    entry = {"version": 1, "job_id": "j3", "dag_id": "j3", "storage_root": "s3://bucket/root", "storage_conn_id": "s3x"}
    (registry / "j3.json").write_text(json.dumps(entry))
    conn = {"conn_type": "aws", "login": "AKIAKEY", "password": SECRET, "extra": {"endpoint_url": "http://127.0.0.1:9"}}
    env = {
        **os.environ,
        "AIRFLOW__CHECKPOINT__STORAGE_ROOT": f"file://{tmp_path}/checkpoints",
        "AIRFLOW_CONN_S3X": json.dumps(conn),
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),  # this checkout's provider
    }
    done = subprocess.run(
        [sys.executable, "-m", "airflow", "checkpoints", "list", "-o", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    assert row["job_id"] == "j3" and row["status"] == "UNREADABLE" and "s3x" in row["status_reason"]
    assert "credentials retrieved" in done.stderr, "the provider's log line went somewhere else"
    assert SECRET not in done.stdout + done.stderr


def test_a_sensor_whose_storage_connection_is_not_defined_fails_instead_of_poking_on(tmp_path, monkeypatch):
    """A local storage root took a misspelt ``storage_conn_id`` silently: the input sensor then poked on for
    ever. The connection must exist; the sensor fails without retry, naming it."""
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_checkpoint.dataflow import FileSource, ParquetTableSink
    from airflow_provider_checkpoint.dataflow.planner import PipelineGraph
    from airflow_provider_checkpoint.jobs.definition import CheckpointJob
    from airflow_provider_checkpoint.sensors.checkpoint import CheckpointInputSensor

    (tmp_path / "landing").mkdir()
    (tmp_path / "landing" / "0.json").write_text('{"x": 1}\n')
    events = FileSource("events", str(tmp_path / "landing"), "json", "x LONG")
    graph = PipelineGraph([events, ParquetTableSink("out", events, str(tmp_path / "out"))])
    job = CheckpointJob("sensed", graph, storage_root=f"file://{tmp_path}/root", storage_conn_id="no_such_conn")
    sensor = CheckpointInputSensor(task_id="wait", job=job, deferrable=False)
    with pytest.raises(AirflowFailException, match=r"connection 'no_such_conn' .* is not defined"):
        sensor.poke({})
    monkeypatch.setenv("AIRFLOW_CONN_NO_SUCH_CONN", "fs://")
    assert sensor.poke({}).xcom_value == {"sources": ["events"]}  # defined: the input is seen
