"""DeltaSource positions and the Delta log as untrusted documents (no Spark): hand-written logs on a
real filesystem, positions from a forged plan, and the definition checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import fsspec
import pytest

from airflow_provider_checkpoint.connectors.delta import log as delta_log
from airflow_provider_checkpoint.connectors.delta.log import DataFile, Position
from airflow_provider_checkpoint.connectors.delta.source import DeltaSource
from airflow_provider_checkpoint.exceptions import (
    DeltaSourceError,
    DocumentError,
    InvalidPositionError,
    PipelineDefinitionError,
)


def write_commit(root: Path, version: int, *actions: dict[str, Any]) -> None:
    log = root / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    (log / f"{version:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))


def add(path: str, data_change: bool = True, **extra: Any) -> dict[str, Any]:
    return {"add": {"path": path, "partitionValues": {"day": "d1"}, "size": 1, "dataChange": data_change, **extra}}


def remove(path: str, data_change: bool = True) -> dict[str, Any]:
    return {"remove": {"path": path, "partitionValues": {"day": "d1"}, "dataChange": data_change}}


def commit_at(root: Path, version: int) -> delta_log.Commit:
    return delta_log.read_commit(fsspec.filesystem("file"), str(root), version, "tbl")


def commit(root: Path, version: int, *actions: dict[str, Any]) -> delta_log.Commit:
    write_commit(root, version, {"commitInfo": {"operation": "TEST"}}, *actions)
    return commit_at(root, version)


@pytest.mark.parametrize(
    "position",
    [
        {},
        {"version": "3"},
        {"version": True},
        {"version": -2},
        {"version": 2**63},
        {"version": 1, "table_id": "../x"},
        {"version": 1, "table_id": 7},
        [1],
        "version",
    ],
)
def test_forged_positions_are_refused(position: object) -> None:
    with pytest.raises(InvalidPositionError, match="source src"):
        delta_log.validate_position("src", position)


def test_valid_positions() -> None:
    assert delta_log.validate_position("src", None) is None
    assert delta_log.validate_position("src", {"version": -1}) == Position(-1)
    assert delta_log.validate_position("src", {"version": 4, "table_id": "0a38a57e-c9c0"}) == Position(
        4, "0a38a57e-c9c0"
    )


def test_starting_version_sets_the_initial_position(tmp_path: Path) -> None:
    assert DeltaSource("a", str(tmp_path)).initial_position() is None
    source = DeltaSource("b", str(tmp_path), starting_version=3)
    assert source.initial_position() == {"version": 2}
    assert source._start(None) == Position(2)
    assert source._start({"version": 7, "table_id": "x"}) == Position(7, "x")


@pytest.mark.parametrize(
    "kwargs", [{"starting_version": -1}, {"starting_version": True}, {"max_commits_per_checkpoint": 0}]
)
def test_definition_errors(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    with pytest.raises(PipelineDefinitionError):
        DeltaSource("src", str(tmp_path), **kwargs)


@pytest.mark.parametrize(
    "path",
    [
        "../outside.parquet",
        "/etc/passwd",
        "s3://other/x.parquet",
        "a/%2E%2E/%2E%2E/b.parquet",
        "a//b",
        "x\\y",
        "day=*/x.parquet",
        "a{b,c}.parquet",
    ],
)
def test_log_paths_outside_the_table_are_refused(tmp_path: Path, path: str) -> None:
    with pytest.raises(DocumentError, match=r"tbl/_delta_log/00000000000000000000\.json: field line 2\.add\.path"):
        commit(tmp_path, 0, add(path))


def test_log_values_are_checked(tmp_path: Path) -> None:
    with pytest.raises(DocumentError, match="partitionValues.day"):
        commit(tmp_path, 0, {"add": {"path": "a.parquet", "partitionValues": {"day": 1}}})
    with pytest.raises(DocumentError, match="deletionVector"):
        commit(tmp_path, 1, add("a.parquet", deletionVector={"storageType": "u"}))
    with pytest.raises(DocumentError, match="dataChange"):
        commit(tmp_path, 2, add("a.parquet", data_change="yes"))  # type: ignore[arg-type]
    with pytest.raises(DocumentError, match="not valid JSON"):
        (tmp_path / "_delta_log" / f"{3:020d}.json").write_text("{")
        commit_at(tmp_path, 3)


def test_encoded_paths_are_decoded_once(tmp_path: Path) -> None:
    (file,) = commit(tmp_path, 0, add("day=a%2520b/part-0.parquet")).adds
    assert file == DataFile("day=a%20b/part-0.parquet", (("day", "d1"),), "insert", 0, size=1)


def test_appends_and_compactions_without_change_data_feed(tmp_path: Path) -> None:
    appended = commit(tmp_path, 0, add("a.parquet"), add("b.parquet"))
    assert [f.path for f in delta_log.changed_files(appended, "tbl", False)] == ["a.parquet", "b.parquet"]
    assert all(f.change_type is None for f in delta_log.changed_files(appended, "tbl", False))
    compacted = commit(tmp_path, 1, remove("a.parquet", False), remove("b.parquet", False), add("c.parquet", False))
    assert delta_log.changed_files(compacted, "tbl", False) == []
    deleted = commit(tmp_path, 2, remove("c.parquet"))
    with pytest.raises(DeltaSourceError, match=r"tbl: commit 2 \(TEST\) removes 1 file"):
        delta_log.changed_files(deleted, "tbl", False)


def test_change_data_feed_takes_cdc_files_else_adds_and_removes(tmp_path: Path) -> None:
    cdc = {"cdc": {"path": "_change_data/x.parquet", "partitionValues": {}, "dataChange": False}}
    updated = commit(tmp_path, 0, add("new.parquet"), remove("old.parquet"), cdc)
    assert delta_log.changed_files(updated, "tbl", True) == [DataFile("_change_data/x.parquet", (), None, 0)]
    rewritten = commit(tmp_path, 1, add("n.parquet"), remove("o.parquet"))
    changes = [(f.path, f.change_type, f.commit_version) for f in delta_log.changed_files(rewritten, "tbl", True)]
    assert changes == [("n.parquet", "insert", 1), ("o.parquet", "delete", 1)]


def test_a_file_re_added_with_another_dv_changes_only_in_the_rows_whose_bit_changed(tmp_path: Path) -> None:
    """A delete by deletion vector (no change files): the remove with the old DV and the add with the new one
    give the rows the new DV deletes and the old did not (deletes), and those the old DV deleted and the new
    one not (inserts); a file removed and re-added with the same DV, or without DVs, stays whole-file."""

    def dv(text: str, cardinality: int) -> dict[str, Any]:
        return {
            "deletionVector": {"storageType": "i", "pathOrInlineDv": text, "sizeInBytes": 5, "cardinality": cardinality}
        }

    def removed(path: str, **extra: Any) -> dict[str, Any]:
        action = remove(path)
        action["remove"].update(extra)
        return action

    first = commit(tmp_path, 0, removed("f.parquet"), add("f.parquet", **dv("abcde", 1)))
    (delete,) = delta_log.changed_files(first, "tbl", True)
    assert (delete.change_type, delete.deletion_vector, delete.rows_of) == (
        "delete",
        None,
        first.adds[0].deletion_vector,
    )
    second = commit(tmp_path, 1, removed("f.parquet", **dv("abcde", 1)), add("f.parquet", **dv("vwxyz", 2)))
    changes = {f.change_type: (f.deletion_vector, f.rows_of) for f in delta_log.changed_files(second, "tbl", True)}
    old, new = second.removes[0].deletion_vector, second.adds[0].deletion_vector
    assert changes == {"delete": (old, new), "insert": (new, old)}
    same = commit(tmp_path, 2, removed("g.parquet", **dv("abcde", 1)), add("g.parquet", **dv("abcde", 1)))
    assert [(f.change_type, f.rows_of) for f in delta_log.changed_files(same, "tbl", True)] == [
        ("insert", None),
        ("delete", None),
    ]


def test_a_commit_gone_from_the_log_names_the_oldest_one(tmp_path: Path) -> None:
    commit(tmp_path, 5, add("a.parquet"))
    commit(tmp_path, 6, add("b.parquet"))
    with pytest.raises(DeltaSourceError, match="commit 3 is no longer in its log .its oldest commit is 5"):
        commit_at(tmp_path, 3)


def test_column_mapping_is_refused() -> None:
    with pytest.raises(DeltaSourceError, match="tbl: version 4 uses column mapping"):
        delta_log.check_metadata({"configuration": {"delta.columnMapping.mode": "name"}}, "tbl", 4)
    delta_log.check_metadata({"configuration": {"delta.columnMapping.mode": "none"}}, "tbl", 4)


def test_not_a_delta_table(tmp_path: Path) -> None:
    with pytest.raises(DeltaSourceError, match="is not a Delta table"):
        DeltaSource("src", str(tmp_path)).barrier_position(None)


def test_a_deferred_input_sensor_rebuilds_the_source_from_its_json_spec(tmp_path: Path) -> None:
    from airflow_provider_checkpoint.triggers.checkpoint import source_from_spec, source_spec

    source = DeltaSource("src", str(tmp_path), {"timeout": "5s"}, True, 3, 10, "skip")
    spec = json.loads(json.dumps(source_spec(source)))  # stored in the metadata DB as JSON
    rebuilt = source_from_spec(spec)
    assert isinstance(rebuilt, DeltaSource) and source_spec(rebuilt) == spec
    assert (rebuilt.path, rebuilt.change_data_feed, rebuilt.starting_version) == (str(tmp_path), True, 3)
    assert rebuilt.on_restore == "skip"


def test_an_upstream_restore_names_the_ways_back_or_is_skipped(tmp_path: Path) -> None:
    """Issue #30 defect 4: a RESTORE of the table (its writer's job was restored) stalls an append-only
    source with the ways back; ``on_restore="skip"`` reads it as no change; the change feed reads it."""
    write_commit(tmp_path, 0, {"commitInfo": {"operation": "WRITE"}}, add("a.parquet"), add("b.parquet"))
    write_commit(
        tmp_path,
        1,
        {"commitInfo": {"operation": "RESTORE"}},
        remove("b.parquet"),
        remove("a.parquet"),
        add("a.parquet"),
    )
    restored = commit_at(tmp_path, 1)
    with pytest.raises(DeltaSourceError, match=r"commit 1 is a RESTORE .* removes 2 file\(s\) and re-adds 1.*'skip'"):
        delta_log.changed_files(restored, "tbl", False)
    assert delta_log.changed_files(restored, "tbl", False, "skip") == []
    assert [f.change_type for f in delta_log.changed_files(restored, "tbl", True)] == ["insert", "delete", "delete"]
    source = DeltaSource("src", str(tmp_path), on_restore="skip")
    assert source._changes(-1, 1) == [
        DataFile("a.parquet", (("day", "d1"),), size=1),
        DataFile("b.parquet", (("day", "d1"),), size=1),
    ]
    with pytest.raises(DeltaSourceError, match="is a RESTORE"):
        DeltaSource("src", str(tmp_path))._changes(0, 1)
    with pytest.raises(PipelineDefinitionError, match="on_restore must be one of"):
        DeltaSource("src", str(tmp_path), on_restore="ignore")
