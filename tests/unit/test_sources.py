"""FileSource positions (no Spark): listing, barrier, split, validation, bounds and clean_source."""

from __future__ import annotations

import json
import os
from datetime import date, timedelta
from pathlib import Path

import pytest

from airflow_provider_checkpoint.connectors.files.source import FileSource
from airflow_provider_checkpoint.exceptions import InjectedFault, InvalidPositionError, PipelineDefinitionError
from tests.unit.helpers import T0, make_ack, make_env


def land(root: Path, rel: str, data: bytes, mtime: float | None = None) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    if mtime is not None:
        os.utime(p, (mtime, mtime))


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
    assert source.split(None, barrier) == {"a.json": 4, "day=1/b.json": 6}


def test_next_barrier_adds_new_files_and_forgets_files_that_left(landing: Path) -> None:
    source = FileSource("events", str(landing), "json", "k INT", pattern="*.json")
    first = source.barrier_position(None)
    land(landing, "z.json", b"12")
    land(landing, "a.json", b"123456789")  # grown after it was processed: position keeps the old size
    (landing / "day=1/b.json").unlink()  # left the directory: no longer in the position
    second = source.barrier_position(first)
    assert second == {"files": {"a.json": 4, "z.json": 2}}
    assert source.split(first, second) == {"z.json": 2}
    assert source.split(second, second) == {}


def test_a_late_file_with_an_old_modification_time_is_read_once(landing: Path) -> None:
    source = FileSource("events", str(landing), "json", "k INT", pattern="*.json")
    first = source.barrier_position(None)
    land(landing, "late.json", b"123", mtime=1_000_000.0)  # written long ago, visible only now
    second = source.barrier_position(first)
    assert source.split(first, second) == {"late.json": 3}
    assert source.split(second, source.barrier_position(second)) == {}


def test_a_position_in_the_format_of_earlier_versions_is_read(landing: Path) -> None:
    """Earlier positions listed every file ever processed, also files long gone."""
    source = FileSource("events", str(landing), "json", "k INT", pattern="*.json")
    old = {"files": {"a.json": 4, "day=1/b.json": 6, **{f"gone/{i}.json": 10 for i in range(500)}}}
    land(landing, "new.json", b"12345")
    barrier = source.barrier_position(old)
    assert barrier == {"files": {"a.json": 4, "day=1/b.json": 6, "new.json": 5}}
    assert source.split(old, barrier) == {"new.json": 5}


@pytest.mark.parametrize(
    "name",
    [
        "/etc/passwd",
        "../up.json",
        "a/../b.json",
        "./a.json",
        "a//b.json",
        "s3://bucket/x",
        "file:/x",
        "a\\b",
        "a\nb",
        "",
    ],
)
def test_unsafe_file_names_in_a_stored_position_are_refused(landing: Path, name: str) -> None:
    source = FileSource("events", str(landing), "json", "k INT")
    with pytest.raises(InvalidPositionError, match=r"source events: file name .* in a stored position"):
        source.barrier_position({"files": {name: 1}})
    with pytest.raises(InvalidPositionError, match="source events"):
        source.split(None, {"files": {name: 1}})


@pytest.mark.parametrize(
    "position", [[], {"files": []}, {"file": {}}, {"files": {"a.json": -1}}, {"files": {"a": "1"}}]
)
def test_malformed_stored_positions_are_refused(landing: Path, position: object) -> None:
    source = FileSource("events", str(landing), "json", "k INT")
    with pytest.raises(InvalidPositionError, match="source events"):
        source.barrier_position(position)


def test_max_files_per_checkpoint_splits_a_backlog_oldest_first(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    names = [f"f{i}.json" for i in range(7)]
    for i, name in enumerate(names):  # modification times in the reverse of name order
        land(landing, name, b"x" * (i + 1), mtime=T0 - 10 * i)
    source = FileSource("events", str(landing), "json", "k INT", max_files_per_checkpoint=3)
    position, batches = None, []
    for _ in range(4):
        barrier = source.barrier_position(position)
        batches.append(sorted(source.split(position, barrier)))
        position = barrier
    assert batches == [sorted(names[4:]), sorted(names[1:4]), [names[0]], []]
    assert source.barrier_position(None) == source.barrier_position(None)  # deterministic


def run_with_cleaning(source: FileSource, landing: Path, checkpoints: int, per_checkpoint: int) -> list[int]:
    """Land files and commit barriers as the coordinator would; the size of every position."""
    position: dict | None = None
    sizes: list[int] = []
    read: set[str] = set()
    for n in range(1, checkpoints + 1):
        for i in range(per_checkpoint):
            land(landing, f"dt=2026-01-{n % 28 + 1:02d}/events-{n:04d}-{i}.json", b"{}\n" * (i + 1))
        barrier = source.barrier_position(position)
        todo = source.split(position, barrier)
        assert len(todo) == per_checkpoint and not read & set(todo), "each file exactly once"
        read |= set(todo)
        source.on_checkpoint_committed(n, barrier)
        position = barrier
        sizes.append(len(json.dumps(position)))
    return sizes


@pytest.mark.parametrize("clean_source", ["archive", "delete"])
def test_position_size_stays_flat_over_many_checkpoints(tmp_path: Path, clean_source: str) -> None:
    landing, archive = tmp_path / "landing", tmp_path / "archive"
    landing.mkdir()
    source = FileSource(
        "events",
        str(landing),
        "json",
        "k INT",
        clean_source=clean_source,
        archive_dir=str(archive) if clean_source == "archive" else None,
    )
    sizes = run_with_cleaning(source, landing, checkpoints=60, per_checkpoint=3)
    assert max(sizes) == max(sizes[:2]), f"position grew with the job's age: {sizes}"
    assert not list(landing.rglob("*.json"))
    archived = sorted(p.relative_to(archive).as_posix() for p in archive.rglob("*.json"))
    assert len(archived) == (180 if clean_source == "archive" else 0)


def test_archive_is_idempotent_and_finishes_an_interrupted_move(tmp_path: Path) -> None:
    landing, archive = tmp_path / "landing", tmp_path / "archive"
    land(landing, "p/a.json", b"aaa")
    land(landing, "p/b.json", b"bbbb")
    land(landing, "c.json", b"c")
    source = FileSource("events", str(landing), "json", "k INT", clean_source="archive", archive_dir=str(archive))
    position = source.barrier_position(None)
    land(archive, "p/b.json", b"bbbb")  # a move that copied, then crashed before removing the source
    land(landing, "c.json", b"changed")  # not the file that was read: left alone
    land(landing, "d.json", b"not yet read")
    source.on_checkpoint_committed(1, position)
    source.on_checkpoint_committed(1, position)
    assert sorted(p.relative_to(landing).as_posix() for p in landing.rglob("*.json")) == ["c.json", "d.json"]
    assert (archive / "p/a.json").read_bytes() == b"aaa" and (archive / "p/b.json").read_bytes() == b"bbbb"
    assert not (archive / "c.json").exists()


def test_clean_source_options_are_checked(tmp_path: Path) -> None:
    landing = str(tmp_path / "landing")
    with pytest.raises(PipelineDefinitionError, match="clean_source must be one of"):
        FileSource("e", landing, "json", "k INT", clean_source="move")
    with pytest.raises(PipelineDefinitionError, match="archive_dir is required"):
        FileSource("e", landing, "json", "k INT", clean_source="archive")
    with pytest.raises(PipelineDefinitionError, match="archive_dir is required"):
        FileSource("e", landing, "json", "k INT", clean_source="delete", archive_dir=str(tmp_path / "a"))
    with pytest.raises(PipelineDefinitionError, match="would be read again"):
        FileSource("e", landing, "json", "k INT", clean_source="archive", archive_dir=f"{landing}/archive")
    with pytest.raises(PipelineDefinitionError, match="on the filesystem of"):
        FileSource("e", landing, "json", "k INT", clean_source="archive", archive_dir="s3://bucket/archive")
    with pytest.raises(PipelineDefinitionError, match="max_files_per_checkpoint"):
        FileSource("e", landing, "json", "k INT", max_files_per_checkpoint=0)
    FileSource("e", landing, "json", "k INT", clean_source="archive", archive_dir=f"{landing}/_archive")


def test_date_partitions_bound_listing_and_position_with_clean_source_off(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    source = FileSource(
        "events", str(landing), "json", "k INT", partition_pattern="dt=%Y-%m-%d", partition_lateness=timedelta(days=2)
    )
    position: dict | None = None
    sizes, listed = [], []
    for day in range(60):
        partition = f"dt={date(2026, 1, 1) + timedelta(days=day)}"
        land(landing, f"{partition}/a.json", b"{}\n")
        land(landing, f"{partition}/b.json", b"{}\n{}\n")
        if day > 0:  # a late file for yesterday's partition, still open
            land(landing, f"dt={date(2026, 1, 1) + timedelta(days=day - 1)}/late.json", b"{}\n")
        barrier = source.barrier_position(position)
        todo = source.split(position, barrier)
        assert len(todo) == (2 if day == 0 else 3), todo
        position = barrier
        sizes.append(len(json.dumps(position)))
        listed.append(len(source.listing(source_floor(source, position)).files))
    assert position is not None and position["partition_floor"] == "2026-02-27T00:00:00"
    assert max(sizes[5:]) == min(sizes[5:]), f"position grew with the job's age: {sizes}"
    assert max(listed[5:]) == 8, "only the open partitions are listed"


def source_floor(source: FileSource, position: dict) -> object:
    from airflow_provider_checkpoint.connectors.files.positions import validate_position

    return validate_position(source.uid, position).partition_floor


def test_partition_floor_waits_for_a_backlog(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    for day in range(1, 6):
        land(landing, f"2026/01/0{day}/x.json", b"{}\n", mtime=T0 + day)
    source = FileSource(
        "events",
        str(landing),
        "json",
        "k INT",
        partition_pattern="%Y/%m/%d",
        max_files_per_checkpoint=2,
        partition_lateness=timedelta(0),
    )
    position: dict | None = None
    read: list[str] = []
    for _ in range(4):
        barrier = source.barrier_position(position)
        read += sorted(source.split(position, barrier))
        position = barrier
    assert read == [f"2026/01/0{day}/x.json" for day in range(1, 6)]
    assert position is not None and position["partition_floor"] == "2026-01-05T00:00:00"


def test_unknown_format_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(PipelineDefinitionError):
        FileSource("events", str(tmp_path), "xml", "k INT")


def test_crash_between_commit_and_archiving_is_finished_by_the_next_trigger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "archive"
    env = make_env(tmp_path, clean_source="archive", archive_dir=str(archive))
    plan = env.coordinator.trigger("run-1", now=T0)
    monkeypatch.setenv("CHECKPOINT_FAULTS", "finalize.before_clean_source:checkpoint=1")
    with pytest.raises(InjectedFault):
        env.coordinator.finalize(plan, [make_ack(env, plan)], now=T0 + 1)
    assert (env.chk(1) / "_metadata").exists(), "committed"
    assert (env.landing / "a.json").exists() and not archive.exists(), "not archived before the crash point"

    monkeypatch.delenv("CHECKPOINT_FAULTS")
    (env.landing / "b.json").write_bytes(b'{"k": 2}\n')
    plan2 = env.coordinator.trigger("run-2", now=T0 + 10)  # recovery of checkpoint 1 archives a.json
    assert (archive / "a.json").read_bytes() == b'{"k": 1}\n' and not (env.landing / "a.json").exists()
    source = env.coordinator.graph.sources[0]
    assert isinstance(source, FileSource)
    assert plan2.restore_point is not None
    assert source.split(plan2.restore_point.source_positions["events"], plan2.barrier.positions["events"]) == {
        "b.json": 9
    }
    env.coordinator.finalize(plan2, [make_ack(env, plan2)], now=T0 + 11)
    assert (archive / "b.json").exists() and not list(env.landing.iterdir())


def test_files_of_an_aborted_checkpoint_are_not_cleaned(tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    env = make_env(tmp_path, clean_source="archive", archive_dir=str(archive))
    plan = env.coordinator.trigger("run-1", now=T0)
    with pytest.raises(Exception, match="step_table"):
        env.coordinator.finalize(plan, [], now=T0 + 1)  # the step never acked
    assert (env.landing / "a.json").exists() and not archive.exists()
