"""Boundary validation of stored documents and confinement of the paths they name (no Spark, no Airflow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_provider_checkpoint.connectors.files.parquet_files import check_table_committables
from airflow_provider_checkpoint.core import metadata
from airflow_provider_checkpoint.core.documents import relative_path
from airflow_provider_checkpoint.core.job_record import JobRecord
from airflow_provider_checkpoint.core.model import Ack, RestoreRequest
from airflow_provider_checkpoint.exceptions import (
    CheckpointStorageError,
    DocumentError,
    JobRecordError,
    MetadataError,
    UnsafePathError,
)
from airflow_provider_checkpoint.state.handles import HandleScope, StateHandle
from airflow_provider_checkpoint.storage import JobStorage, Location
from airflow_provider_checkpoint.storage.job_records import JobRecordStore
from airflow_provider_checkpoint.storage.paths import resolve_under_roots
from tests.unit.helpers import sample

SHA = "sha256:" + "0" * 64


@pytest.mark.parametrize(
    "value, problem",
    [
        ("../x", "not normalized"),
        ("a/../../x", "not normalized"),
        ("/etc/passwd", "is absolute"),
        ("file:///etc/passwd", "has a scheme"),
        ("s3://bucket/key", "has a scheme"),
        ("a\\..\\x", "backslash"),
        ("a\nb", "control character"),
        ("a\x00b", "control character"),
        ("a//b", "not normalized"),
        ("./a", "not normalized"),
        ("", "is empty"),
        ("a b", "characters outside"),
        ("%2e%2e/x", "characters outside"),
        (7, "must be a path string"),
    ],
)
def test_unsafe_relative_paths_are_refused_naming_document_field_and_value(value: object, problem: str) -> None:
    with pytest.raises(DocumentError, match=problem) as e:
        relative_path(value, "doc.json", "operators.x.path")
    assert str(e.value).startswith("doc.json: field operators.x.path ") and repr(value)[:10] in str(e.value)


def _h(path: str, delta: int | None = None) -> StateHandle:
    return StateHandle(path, 1, "sha256:" + "0" * 64, (0, 127) if delta else None, delta)


def test_handle_scopes() -> None:
    checkpoint = HandleScope(7)
    assert checkpoint.problem("op", _h("chk-7/step/attempt-1/state/op/kgr=0/p.parquet")) is None
    assert checkpoint.problem("op", _h("chk-3/step/attempt-1/p.parquet")) is None  # an older checkpoint's file
    assert checkpoint.problem("op", _h("chk-3/step/attempt-1/p.parquet", delta=3)) is None
    assert checkpoint.problem("op", _h("shared/op/x.parquet"))
    assert checkpoint.problem("op", _h("chk-8/step/attempt-1/p.parquet"))  # a newer one cannot be referenced
    assert checkpoint.problem("op", _h("_stats/1.json"))
    savepoint = HandleScope(7, relocatable=True)
    assert savepoint.problem("op", _h("state/op/kg-00000-00127-0000.parquet")) is None
    assert savepoint.problem("op", _h("state/op/kg-00000-00127-0000.parquet", delta=3))  # savepoints hold no deltas
    assert savepoint.problem("op", _h("state/other/kg.parquet"))
    assert savepoint.problem("op", _h("chk-7/x.parquet"))
    ack = HandleScope(7, attempt_dir="chk-7/step_a/attempt-2")
    assert ack.problem("op", _h("chk-7/step_a/attempt-2/state/op/p.parquet")) is None
    assert ack.problem("op", _h("chk-6/step_a/attempt-1/state/op/p.parquet")) is None  # kept from its restore point
    assert ack.problem("op", _h("chk-7/step_a/attempt-1/state/op/p.parquet"))
    assert ack.problem("op", _h("_stats/1.json"))


def test_a_delta_lies_in_the_directory_of_its_checkpoint() -> None:
    good = {"path": "chk-5/s/attempt-1/state/op/delta/kgr=0/p.parquet", "size": 1, "checksum": "sha256:" + "0" * 64}
    assert StateHandle.from_dict({**good, "key_groups": [0, 63], "delta": 5}).delta == 5
    with pytest.raises(DocumentError, match="delta"):
        StateHandle.from_dict({**good, "key_groups": [0, 63], "delta": 4})
    with pytest.raises(DocumentError, match="delta"):
        StateHandle.from_dict({**good, "delta": 5})


def test_a_handle_records_its_least_window_end_as_a_64_bit_integer_or_not_at_all() -> None:
    good = {"path": "chk-5/s/attempt-1/state/op/p.parquet", "size": 1, "checksum": "sha256:" + "0" * 64}
    assert StateHandle.from_dict(good).least_end is None  # written before handles recorded it
    for least in (-(2**63), 0, 1_767_225_600_000_000, 2**63 - 1):
        handle = StateHandle.from_dict({**good, "least_end": least})
        assert handle.least_end == least and StateHandle.from_dict(handle.to_dict()) == handle
    for bad in (2**63, -(2**63) - 1, 1.5, "0", True, [0]):
        with pytest.raises(DocumentError, match="least_end"):
            StateHandle.from_dict({**good, "least_end": bad})


def test_metadata_with_an_escaping_handle_names_the_field() -> None:
    doc = json.loads(metadata.encode(sample()))
    doc["operators"]["counts"]["handles"][1]["path"] = "chk-7/../../../elsewhere/file"
    with pytest.raises(MetadataError, match=r"operators\.counts\.handles\[1\]\.path.*elsewhere"):
        metadata.decode(json.dumps(doc).encode(), "file:///x/_metadata")


@pytest.mark.parametrize(
    "field, value",
    [
        ("checkpoint_id", 2**64),
        ("checkpoint_id", True),
        ("trigger_time", float("nan")),
        ("completion_time", "soon"),
        ("job_id", "../other"),
        ("options", {"savepoint_target": "file:///x\n/y"}),
        ("options", {"restore_request_id": "../x"}),
    ],
)
def test_metadata_values_are_typed_and_bounded(field: str, value: object) -> None:
    doc = json.loads(metadata.encode(sample()))
    doc[field] = value
    with pytest.raises(MetadataError, match=field):
        metadata.decode(json.dumps(doc).encode())


def test_deep_nesting_and_huge_numbers_are_document_errors() -> None:
    with pytest.raises(MetadataError, match="not valid JSON"):
        metadata.decode(b"[" * 200_000 + b"]" * 200_000)
    with pytest.raises(JobRecordError):
        JobRecord.decode(b'{"version": 1, "job_id": "j", "last_checkpoint_id": ' + b"9" * 5000 + b"}")


def ack(**overrides: object) -> dict:
    handle = {"path": "chk-3/step_a/attempt-2/state/op/p.parquet", "size": 1, "checksum": SHA}
    doc = {
        "job_id": "job",
        "checkpoint_id": 3,
        "step": "step_a",
        "attempt": 2,
        "attempt_dir": "chk-3/step_a/attempt-2",
        "operators": {"op": {"handles": [handle], "schema": "{}", "keys": ["k"], "max_parallelism": 128}},
        "sinks": {},
        "metrics": {},
    }
    return {**doc, **overrides}


def test_an_ack_names_only_its_own_attempt_directory() -> None:
    assert Ack.from_dict(ack()).attempt_dir == "chk-3/step_a/attempt-2"
    with pytest.raises(DocumentError, match="attempt_dir must be chk-3/step_a/attempt-2"):
        Ack.from_dict(ack(attempt_dir="chk-3/step_a/attempt-1"))
    with pytest.raises(DocumentError, match="attempt_dir"):
        Ack.from_dict(ack(attempt_dir="../../elsewhere"))
    with pytest.raises(DocumentError, match="step"):
        Ack.from_dict(ack(step="../x", attempt_dir="chk-3/../x/attempt-2"))
    other = ack(attempt=1, attempt_dir="chk-3/step_a/attempt-1")
    with pytest.raises(DocumentError, match=r"handles\[0\]\.path must lie under chk-3/step_a/attempt-1/"):
        Ack.from_dict(other, "ack of task step_a")


def moves(*pairs: tuple[str, str], checkpoint_id: int = 4) -> list[dict]:
    return [{"checkpoint_id": checkpoint_id, "moves": [list(p) for p in pairs]}]


def test_table_committables_have_the_shape_the_sink_stages() -> None:
    good = moves(("_staging/chk-4/job/step/attempt-1/part-0.parquet", "part-c0000000004-00000.parquet"))
    assert check_table_committables(4, good, "append", "doc")
    filled = moves(("_staging/chk-4/job/step/attempt-1-filled/x.parquet", "part-c0000000003-00000.parquet"))
    assert check_table_committables(4, filled, "append", "doc"), "an earlier file rewritten with an added column"
    bucket = moves(("_staging/chk-4/job/s/attempt-1/_bucket=3/part-0.parquet", "part-b00003.parquet"))
    assert check_table_committables(4, bucket, "upsert", "doc")
    bad = [
        (moves(("_staging/chk-3/x.parquet", "part-c0000000004-00000.parquet")), "must lie under _staging/chk-4/"),
        (moves(("_staging/chk-4/../../x", "part-c0000000004-00000.parquet")), "not normalized"),
        (moves(("_staging/chk-4/x", "part-c0000000005-00000.parquet")), "a checkpoint after 4"),
        (moves(("_staging/chk-4/x", "part-c0000000003-0000.parquet")), "expected shape"),
        (moves(("_staging/chk-4/x", "../part-c0000000004-00000.parquet")), "not normalized"),
        (moves(("_staging/chk-4/x", "part-b00001.parquet")), "expected shape"),  # an upsert name in append
        (moves(("_staging/chk-4/x", "p"), checkpoint_id=5), "checkpoint_id must be 4"),
        ([{"checkpoint_id": 4, "moves": [["only one"]]}], r"must be \[staged, target\]"),
        (
            moves(
                ("_staging/chk-4/a", "part-c0000000004-00000.parquet"),
                ("_staging/chk-4/b", "part-c0000000004-00000.parquet"),
            ),
            "twice",
        ),
    ]
    for committables, problem in bad:
        with pytest.raises(DocumentError, match=problem):
            check_table_committables(4, committables, "append", "doc")


def test_location_refuses_to_resolve_outside_its_base(tmp_path: Path) -> None:
    base = tmp_path / "base"
    (base / "inside").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (base / "out-link").symlink_to(tmp_path / "outside")
    (base / "in-link").symlink_to(base / "inside")
    location = Location.from_url(f"file://{base}")
    assert location.path("in-link/x") == f"{base}/in-link/x"
    for bad in ("../outside/x", "/etc/passwd", "out-link/x", "out-link", "a/../../outside"):
        with pytest.raises(UnsafePathError):
            location.path(bad)
        with pytest.raises(UnsafePathError):
            location.delete(bad)
    assert (tmp_path / "outside").is_dir()


@pytest.mark.parametrize(
    "param", ["{root}/sp\n/x", "{root}/sp\t", " {root}/sp", "{root}/sp?x", "{root}/sp#x", "{root}/%2e%2e/x"]
)
def test_params_that_parsing_would_alter_are_refused(tmp_path: Path, param: str) -> None:
    with pytest.raises(UnsafePathError, match="not a plain path"):
        resolve_under_roots(param.format(root=f"file://{tmp_path}"), [f"file://{tmp_path}"])


def test_job_record_of_another_job_is_refused(tmp_path: Path) -> None:
    storage = JobStorage.for_job(str(tmp_path), "mine")
    storage.write_atomic("_job.json", JobRecord("theirs").encode())
    with pytest.raises(JobRecordError, match="belongs to job 'theirs'"):
        JobRecordStore(storage).load()


def test_restore_request_is_validated_on_read(tmp_path: Path) -> None:
    storage = JobStorage.for_job(str(tmp_path), "job")
    request = RestoreRequest("a" * 32, "file:///sp/x", 3, False, 1.0)
    JobRecordStore(storage).write_restore_request(request)
    assert JobRecordStore(storage).load_restore_request() == request
    storage.write_atomic("_restore.json", json.dumps({**request.to_dict(), "checkpoint_id": "3; rm -rf"}).encode())
    with pytest.raises(CheckpointStorageError, match="checkpoint_id"):
        JobRecordStore(storage).load_restore_request()


def test_unreadable_lease_shapes_are_never_broken(tmp_path: Path) -> None:
    storage = JobStorage.for_job(str(tmp_path), "job")
    for body in (b"[1]", b'{"run_id": "r", "expires_at": "never"}', b"\xff"):
        storage.write_atomic("_lease", body)
        assert "unreadable lease" in str(JobRecordStore(storage).lease_holder())


def test_savepoint_entries_keep_what_sinks_recorded_and_refuse_other_shapes() -> None:
    record = JobRecord("j")
    record.savepoints = [{"checkpoint_id": 2, "path": "file:///sp", "time": 1.0, "sinks": {"t": {"delta_version": 7}}}]
    assert JobRecord.decode(record.encode()).savepoints == record.savepoints
    for sinks in ({"t": {"v": [1]}}, {"t": 3}, {"../x": {"v": 1}}, {"t": {"v": "x" * 300}}):
        record.savepoints[0]["sinks"] = sinks
        with pytest.raises(JobRecordError):
            JobRecord.decode(record.encode())
