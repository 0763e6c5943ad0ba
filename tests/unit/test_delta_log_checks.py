"""The provider's check of a Delta log before delta-rs reads it: what a plain open reads, what history
and restore read, log checkpoints; and the sink opening its table once per call (no server needed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_checkpoint.connectors.delta import log_checks
from airflow_provider_checkpoint.connectors.delta.opened import OpenedTable
from airflow_provider_checkpoint.connectors.delta.sink import DeltaTableSink
from airflow_provider_checkpoint.dataflow.graph import Source
from airflow_provider_checkpoint.exceptions import DocumentError

ROWS = pa.table({"k": pa.array(["a", "b"]), "v": pa.array([1, 2], pa.int64())})
DEEP = "[" * (log_checks.MAX_JSON_DEPTH + 1) + "]" * (log_checks.MAX_JSON_DEPTH + 1)


def _table(path: Path, commits: int) -> None:
    from deltalake import write_deltalake

    for _ in range(commits):
        write_deltalake(str(path), ROWS, mode="append")


def _check(path: Path, whole: bool = False) -> log_checks.LogState | None:
    return log_checks.check_log(fsspec.filesystem("file"), str(path), str(path), whole)


def test_a_plain_open_checks_the_newest_checkpoint_and_the_commits_after_it_history_the_whole_log(tmp_path):
    """A commit before the newest log checkpoint is read by history and time travel, not by a plain open:
    only the whole-log check refuses it; a commit after the checkpoint is refused by both."""
    from deltalake import DeltaTable

    _table(tmp_path, 3)
    DeltaTable(str(tmp_path)).create_checkpoint()  # at version 2
    _table(tmp_path, 1)
    (tmp_path / "_delta_log" / f"{1:020d}.json").write_text('{"commitInfo":' + DEEP + "}\n")
    state = _check(tmp_path)
    assert state is not None and state.version == 3
    with pytest.raises(DocumentError, match=f"{1:020d}.json.*nests deeper"):
        _check(tmp_path, whole=True)
    (tmp_path / "_delta_log" / f"{4:020d}.json").write_text('{"commitInfo":' + DEEP + "}\n")
    with pytest.raises(DocumentError, match=f"{4:020d}.json.*nests deeper"):
        _check(tmp_path)
    assert _check(tmp_path / "none") is None


def test_the_check_replays_txn_versions_and_metadata_as_delta_rs_does_or_says_it_cannot(tmp_path):
    """``txn`` versions by app id and the ``metaData`` from the checkpoint and the commits after it equal
    delta-rs's; a gap in the commits or a log file the check does not know leaves them to delta-rs."""
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

    def commit(app: str, version: int) -> None:
        txn = CommitProperties(app_transactions=[Transaction(app, version)])
        write_deltalake(str(tmp_path), ROWS, mode="append", commit_properties=txn)

    commit("a", 1)
    commit("b", 7)
    DeltaTable(str(tmp_path)).create_checkpoint()
    commit("a", 2)
    state = _check(tmp_path)
    table = DeltaTable(str(tmp_path))
    assert state is not None and state.replayed and state.version == table.version() == 2
    assert state.txns == {"a": table.transaction_version("a"), "b": table.transaction_version("b")} == {"a": 2, "b": 7}
    assert state.metadata is not None and state.metadata["id"] == table.metadata().id
    (tmp_path / "_delta_log" / "00000000000000000003.checkpoint.0000000001.0000000002.parquet").write_bytes(b"")
    assert _check(tmp_path).replayed  # an incomplete multi-part checkpoint is not read
    (tmp_path / "_delta_log" / "00000000000000000002.json").rename(
        tmp_path / "_delta_log" / "00000000000000000004.json"
    )
    assert not _check(tmp_path).replayed  # a gap: delta-rs would refuse the table
    (tmp_path / "_delta_log" / "00000000000000000004.json").rename(
        tmp_path / "_delta_log" / "00000000000000000002.json"
    )
    (tmp_path / "_delta_log" / "00000000000000000002.00000000000000000002.compacted.json").write_text("")
    assert not _check(tmp_path).replayed


@pytest.mark.parametrize("damage", ["a stats string nested too deep", "larger than a checkpoint may be"])
def test_a_log_checkpoint_is_checked_before_delta_rs_reads_it(tmp_path, monkeypatch, damage):
    """delta-rs parses a checkpoint's ``stats`` strings as it parses a commit's, and loads it whole: a
    checkpoint holding a string nested too deep, or larger than :data:`MAX_CHECKPOINT_BYTES`, is refused."""
    _table(tmp_path, 2)
    add = pa.array([{"path": "x.parquet", "stats": '{"numRecords":1,"minValues":' + DEEP + "}"}])
    checkpoint = tmp_path / "_delta_log" / f"{1:020d}.checkpoint.parquet"
    pq.write_table(pa.table({"add": add}), checkpoint)
    if damage == "larger than a checkpoint may be":
        pq.write_table(pa.table({"add": pa.array([{"path": "x.parquet", "stats": "{}"}])}), checkpoint)
        monkeypatch.setattr(log_checks, "MAX_CHECKPOINT_BYTES", checkpoint.stat().st_size - 1)
    with pytest.raises(DocumentError, match="checkpoint.parquet.*(nests deeper|bytes, more than)"):
        _check(tmp_path)


def test_the_sink_opens_its_table_once_per_call(tmp_path, monkeypatch):
    """A commit (its idempotence check, the commit, the log checkpoint and the record) and a commit record
    open delta-rs's table not at all: the log checkpoint is written from the commit's own log replay."""
    from deltalake import DeltaTable

    opened: list[Any] = []
    load = OpenedTable.load
    monkeypatch.setattr(OpenedTable, "load", lambda self, version=None: opened.append(version) or load(self, version))
    sink = DeltaTableSink("t", Source("src"), str(tmp_path))
    sink.claim("job")
    DeltaTable.create(str(tmp_path), ROWS.schema)
    for checkpoint_id in (1, 2):
        relative = f"chk-{checkpoint_id}/job/step/attempt-1/part-00000.parquet"
        (tmp_path / relative).parent.mkdir(parents=True)
        pq.write_table(ROWS, tmp_path / relative)
        add = {"path": relative, "size": (tmp_path / relative).stat().st_size, "num_records": 2, "partition_values": {}}
        opened.clear()
        sink.commit(checkpoint_id, [{"checkpoint_id": checkpoint_id, "adds": [add], "removes": []}])
        assert opened == []
        assert (tmp_path / "_delta_log" / f"{checkpoint_id:020d}.checkpoint.parquet").exists()
        assert sink.commit_record(checkpoint_id)["t"]["delta_version"] == checkpoint_id
        assert opened == []  # known from the commit
    assert DeltaTable(str(tmp_path)).transaction_version("airflow-checkpoint:job:t") == 2


def test_a_string_that_starts_with_a_bracket_but_is_not_json_is_opaque_unless_its_brackets_nest_too_deep(tmp_path):
    """delta-spark's deletion vector ids are Z85 text that may start with ``{`` (``{04nbR^q$LH{53>yq}4m``):
    such a string is data, not a document to parse; one whose brackets nest deeper than any parser may
    recurse is refused all the same, in a commit and in a log checkpoint."""
    _table(tmp_path, 2)
    log = tmp_path / "_delta_log"
    dv = {"storageType": "u", "pathOrInlineDv": "{04nbR^q$LH{53>yq}4m", "offset": 1, "sizeInBytes": 36}
    add = {"path": "x.parquet", "size": 1, "modificationTime": 1, "dataChange": True, "partitionValues": {}}
    (log / f"{2:020d}.json").write_text(json.dumps({"add": {**add, "deletionVector": dv}}) + "\n")
    state = _check(tmp_path)
    assert state is not None and state.version == 2
    opaque = '{"not json' + "[" * (log_checks.MAX_JSON_DEPTH + 1) + '"' + "{" * (log_checks.MAX_JSON_DEPTH + 1)
    (log / f"{3:020d}.json").write_text(json.dumps({"add": {**add, "stats": opaque}}) + "\n")
    with pytest.raises(DocumentError, match=f"{3:020d}.json.*nests deeper"):
        _check(tmp_path)
    (log / f"{3:020d}.json").unlink()
    checkpoint = log / f"{2:020d}.checkpoint.parquet"
    pq.write_table(pa.table({"add": pa.array([{"path": "x.parquet", "stats": dv["pathOrInlineDv"]}])}), checkpoint)
    assert _check(tmp_path) is not None
    pq.write_table(pa.table({"add": pa.array([{"path": "x.parquet", "stats": opaque}])}), checkpoint)
    with pytest.raises(DocumentError, match="checkpoint.parquet.*nests deeper"):
        _check(tmp_path)
