"""FileSource positions (no Spark): listing, barrier and split."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_checkpoint.dataflow.graph import PipelineDefinitionError
from airflow_provider_checkpoint.dataflow.sources import FileSource


def land(root: Path, rel: str, data: bytes) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)


@pytest.fixture
def landing(tmp_path: Path) -> Path:
    root = tmp_path / "landing"
    land(root, "a.json", b"1234")
    land(root, "day=1/b.json", b"123456")
    land(root, ".c.json.inprogress", b"x")
    land(root, "_tmp/d.json", b"x")
    land(root, "day=1/.e.json", b"x")
    land(root, "notes.txt", b"xy")
    return root


def test_list_files_skips_hidden_and_unmatched(landing: Path) -> None:
    source = FileSource("events", str(landing), "json", "k INT", pattern="*.json")
    assert source.list_files() == {"a.json": 4, "day=1/b.json": 6}
    everything = FileSource("all", str(landing), "json", "k INT")
    assert everything.list_files() == {"a.json": 4, "day=1/b.json": 6, "notes.txt": 2}


def test_list_files_of_missing_directory_names_it(tmp_path: Path) -> None:
    source = FileSource("events", str(tmp_path / "nope"), "json", "k INT")
    with pytest.raises(FileNotFoundError, match="nope"):
        source.list_files()


def test_first_barrier_has_every_visible_file(landing: Path) -> None:
    source = FileSource("events", str(landing), "json", "k INT", pattern="*.json")
    barrier = source.barrier_position(None)
    assert barrier == {"files": {"a.json": 4, "day=1/b.json": 6}}
    assert FileSource.split(None, barrier) == {"a.json": 4, "day=1/b.json": 6}


def test_next_barrier_adds_only_new_files(landing: Path) -> None:
    source = FileSource("events", str(landing), "json", "k INT", pattern="*.json")
    first = source.barrier_position(None)
    land(landing, "z.json", b"12")
    land(landing, "a.json", b"123456789")  # grown after it was processed: position keeps the old size
    (landing / "day=1/b.json").unlink()  # removed: still counted as processed
    second = source.barrier_position(first)
    assert second == {"files": {"a.json": 4, "day=1/b.json": 6, "z.json": 2}}
    assert FileSource.split(first, second) == {"z.json": 2}
    assert FileSource.split(second, second) == {}


def test_unknown_format_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(PipelineDefinitionError):
        FileSource("events", str(tmp_path), "xml", "k INT")
