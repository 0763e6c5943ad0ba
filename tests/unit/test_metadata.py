"""The versioned _metadata codec."""

from __future__ import annotations

import json

import pytest

from airflow_provider_checkpoint.core import metadata
from airflow_provider_checkpoint.core.model import CheckpointType
from airflow_provider_checkpoint.exceptions import MetadataError
from tests.unit.helpers import sample


@pytest.mark.parametrize("type_", list(CheckpointType))
@pytest.mark.parametrize("restored_from", [None, 6])
def test_round_trip_is_equal(type_: CheckpointType, restored_from: int | None) -> None:
    original = sample(type_, restored_from)
    decoded = metadata.decode(metadata.encode(original))
    assert decoded == original
    assert decoded.operators["counts"].handles[1].key_groups == (64, 127)
    assert decoded.operators["counts"].keys == ("page", "user")
    assert decoded.type is type_


def test_encoded_form_is_versioned_json() -> None:
    doc = json.loads(metadata.encode(sample()))
    assert doc["format"] == "airflow-checkpoint"
    assert doc["version"] == 1
    assert doc["checkpoint_id"] == 7


def _doc(**overrides: object) -> bytes:
    doc = json.loads(metadata.encode(sample()))
    doc.update(overrides)
    return json.dumps(doc).encode()


@pytest.mark.parametrize("version", [2, 0, "1", None])
def test_unknown_version_is_refused_naming_the_version(version: object) -> None:
    with pytest.raises(MetadataError) as info:
        metadata.decode(_doc(version=version), source="chk-7/_metadata")
    message = str(info.value)
    assert repr(version) in message
    assert "version" in message
    assert "chk-7/_metadata" in message


@pytest.mark.parametrize("data", [b"", b"not json at all", b"\xff\xfe\x00garbage", b'{"format": "airflow-checkpoint"'])
def test_non_json_is_refused(data: bytes) -> None:
    with pytest.raises(MetadataError) as info:
        metadata.decode(data, source="/x/chk-3/_metadata")
    assert "/x/chk-3/_metadata" in str(info.value)


@pytest.mark.parametrize(
    "data",
    [
        _doc(format="something-else"),
        json.dumps({k: v for k, v in json.loads(_doc()).items() if k != "format"}).encode(),
        b"[1, 2, 3]",
        b'"airflow-checkpoint"',
        b"null",
    ],
)
def test_wrong_format_is_refused(data: bytes) -> None:
    with pytest.raises(MetadataError):
        metadata.decode(data)


@pytest.mark.parametrize("missing", ["job_id", "barrier", "operators", "sinks", "type"])
def test_malformed_document_is_refused(missing: str) -> None:
    doc = json.loads(metadata.encode(sample()))
    del doc[missing]
    with pytest.raises(MetadataError):
        metadata.decode(json.dumps(doc).encode())


def test_unknown_checkpoint_type_is_refused() -> None:
    with pytest.raises(MetadataError):
        metadata.decode(_doc(type="snapshot"))
