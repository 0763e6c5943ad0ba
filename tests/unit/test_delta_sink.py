"""DeltaTableSink committer without Spark: committables are untrusted; commits are idempotent."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_checkpoint.connectors.delta.sink import DeltaTableSink
from airflow_provider_checkpoint.dataflow.graph import Source
from airflow_provider_checkpoint.exceptions import (
    DocumentError,
    PipelineDefinitionError,
    RefusedInputError,
    RestoreError,
    SinkClaimedError,
    UnsafePathError,
)

ROWS = pa.table({"k": pa.array(["a", "b"]), "v": pa.array([1, 2], pa.int64())})


def _sink(table: Path, **kwargs: Any) -> DeltaTableSink:
    from deltalake import DeltaTable

    sink = DeltaTableSink("t", Source("src"), str(table), **kwargs)
    sink.claim("job")
    DeltaTable.create(str(table), ROWS.schema)
    return sink


def _staged(table: Path, checkpoint_id: int, name: str = "part-00000.parquet") -> dict[str, Any]:
    relative = f"chk-{checkpoint_id}/job/step/attempt-1/{name}"
    (table / relative).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(ROWS, table / relative)
    size = (table / relative).stat().st_size
    return {"path": relative, "size": size, "num_records": 2, "partition_values": {}}


def _committables(checkpoint_id: int, *adds: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"checkpoint_id": checkpoint_id, "adds": list(adds), "removes": []}]


def _log_versions(table: Path) -> int:
    return len(list((table / "_delta_log").glob("*.json")))


def test_commit_once_per_checkpoint(tmp_path):
    from deltalake import DeltaTable

    table = tmp_path / "t"
    sink = _sink(table)
    committables = _committables(3, _staged(table, 3))
    assert not sink.is_committed(3)
    sink.commit(3, committables)
    sink.commit(3, committables)
    assert sink.is_committed(3) and sink.is_committed(2) and not sink.is_committed(4)
    assert _log_versions(table) == 2  # the create and one commit
    assert DeltaTable(str(table)).transaction_version("airflow-checkpoint:job:t") == 3
    assert DeltaTable(str(table)).to_pyarrow_table().num_rows == 2
    assert sink.describe_commit(3) == {"delta_version": 1}
    (entry,) = [h for h in DeltaTable(str(table)).history() if h["version"] == 1]
    assert sink.commit_record(3) == {"t": {"delta_version": 1, "commit_time": entry["timestamp"] / 1000}}
    assert sink.commit_record(4) == {}, "a checkpoint the table never committed records nothing"


def _forged(table: Path) -> dict[str, Any]:
    good = _committables(3, _staged(table, 3))
    outside = table.parent / "outside" / "part-0.parquet"  # a real file: a commit naming it would succeed
    outside.parent.mkdir()
    pq.write_table(ROWS, outside)
    bad: dict[str, Any] = {}

    def variant(name: str, change: Any) -> None:
        doc = copy.deepcopy(good)
        change(doc[0])
        bad[name] = doc

    variant("parent segment", lambda c: c["adds"][0].update(path="chk-3/../../outside/part-0.parquet"))
    variant("symlink", lambda c: c["adds"][0].update(path="chk-3/job/link/part-0.parquet"))
    variant("absolute", lambda c: c["adds"][0].update(path=str(outside)))
    variant("scheme", lambda c: c["adds"][0].update(path="s3://bucket/chk-3/part-0.parquet"))
    variant("another checkpoint's file", lambda c: c["adds"][0].update(path="chk-2/job/step/attempt-1/part-0.parquet"))
    zero = table / good[0]["adds"][0]["path"].replace("chk-3", "chk-03")  # abort and audit would not see it
    zero.parent.mkdir(parents=True)
    zero.write_bytes((table / good[0]["adds"][0]["path"]).read_bytes())
    variant("leading zero", lambda c: c["adds"][0].update(path=str(zero.relative_to(table))))
    variant("outside the checkpoint", lambda c: c["adds"][0].update(path="_delta_log/part-0.parquet"))
    variant("not a data file", lambda c: c["adds"][0].update(path="chk-3/job/_table.json"))
    variant("wrong checkpoint id", lambda c: c.update(checkpoint_id=4))
    variant("negative size", lambda c: c["adds"][0].update(size=-1))
    variant("partition values", lambda c: c["adds"][0].update(partition_values={"region": "eu"}))
    variant("remove in append", lambda c: c.update(removes=[{"path": "chk-1/a/part-b00000.parquet", "size": 1}]))
    variant("file twice", lambda c: c.update(adds=c["adds"] * 2))
    variant("wrong size", lambda c: c["adds"][0].update(size=c["adds"][0]["size"] + 1))
    variant("missing file", lambda c: c["adds"][0].update(path="chk-3/job/step/attempt-1/part-00009.parquet"))
    return bad


def test_forged_committables_commit_nothing(tmp_path):
    table = tmp_path / "t"
    sink = _sink(table)
    (table / "chk-3" / "job").mkdir(parents=True)
    (table / "chk-3" / "job" / "link").symlink_to(tmp_path / "outside")
    for name, committables in _forged(table).items():
        with pytest.raises(RefusedInputError):  # DocumentError, or UnsafePathError for the link
            sink.commit(3, committables)
        assert _log_versions(table) == 1 and not sink.is_committed(3), name


def test_upsert_committables_name_each_bucket_once_and_remove_older_files(tmp_path):
    table = tmp_path / "t"
    sink = _sink(table, mode="upsert", keys=["k"], buckets=4)
    add = _staged(table, 5, "part-b00001.parquet")
    check = sink.check_committables
    check(
        5, [{"checkpoint_id": 5, "adds": [add], "removes": [{"path": "chk-2/j/part-b00001.parquet", "size": 9}]}], "d"
    )
    refused = {
        "bucket out of range": [
            {"checkpoint_id": 5, "adds": [{**add, "path": "chk-5/j/part-b00007.parquet"}], "removes": []}
        ],
        "not a bucket file": [
            {"checkpoint_id": 5, "adds": [{**add, "path": "chk-5/j/part-00001.parquet"}], "removes": []}
        ],
        "remove a newer file": [
            {"checkpoint_id": 5, "adds": [], "removes": [{"path": "chk-5/j/part-b00001.parquet", "size": 1}]}
        ],
        "bucket twice": [
            {"checkpoint_id": 5, "adds": [add, {**add, "path": "chk-5/k/part-b00001.parquet"}], "removes": []}
        ],
    }
    for name, committables in refused.items():
        with pytest.raises(DocumentError):
            check(5, committables, "d")
            pytest.fail(name)
    with pytest.raises(DocumentError, match="the table does not hold"):  # shape fine, but not in the table
        sink.commit(
            5, [{"checkpoint_id": 5, "adds": [add], "removes": [{"path": "chk-2/j/part-b00001.parquet", "size": 9}]}]
        )
    assert not sink.is_committed(5)


def test_definition_errors():
    with pytest.raises(PipelineDefinitionError):
        DeltaTableSink("a", Source("s"), "/x", mode="merge")
    with pytest.raises(PipelineDefinitionError):
        DeltaTableSink("b", Source("s"), "/x", mode="upsert")
    with pytest.raises(PipelineDefinitionError):
        DeltaTableSink("c", Source("s"), "/x", mode="upsert", keys=["k"], partition_by=["p"])


def test_audit_finds_files_past_the_tables_retention_and_restore_refuses_a_vacuumed_version(tmp_path):
    from deltalake import DeltaTable

    table = tmp_path / "t"
    sink = _sink(table, mode="upsert", keys=["k"], buckets=4)
    first = _staged(table, 1, "part-b00001.parquet")
    sink.commit(1, [{"checkpoint_id": 1, "adds": [first], "removes": []}])
    second = _staged(table, 2, "part-b00001.parquet")
    removes = [{"path": first["path"], "size": first["size"]}]
    sink.commit(2, [{"checkpoint_id": 2, "adds": [second], "removes": removes}])
    assert sink.audit() == []  # the removed file is within the default retention (a week)
    DeltaTable(str(table)).alter.set_table_properties({"delta.deletedFileRetentionDuration": "interval 0 hours"})
    (finding,) = sink.audit()
    assert "VACUUM" in finding and finding.endswith(first["path"])

    DeltaTable(str(table)).vacuum(dry_run=False)
    assert not (table / first["path"]).exists() and sink.audit() == []  # the log keeps its tombstone
    with pytest.raises(RestoreError, match=r"cannot return to version 1 \(checkpoint 1\)"):
        sink.rollback(1)  # its bucket file is gone


def test_deletion_vector_committables_are_checked(tmp_path):
    from airflow_provider_checkpoint.connectors.delta.deletion_vectors import new_descriptor_path

    table = tmp_path / "t"
    sink = _sink(table, mode="upsert", keys=["k"], buckets=4)
    stored, _ = new_descriptor_path("chk-5/job/step/attempt-1")
    new = {"storageType": "u", "pathOrInlineDv": stored, "offset": 1, "sizeInBytes": 30, "cardinality": 2}
    delete = {"path": "chk-2/j/part-b00001.parquet", "size": 9, "num_records": 4, "old": None, "new": new}
    update = _staged(table, 5, "part-u0000000005-00000.parquet")
    sink.check_committables(5, [{"checkpoint_id": 5, "adds": [update], "removes": [], "deletes": [delete]}], "d")
    older, _ = new_descriptor_path("chk-4/job/step/attempt-1")
    refused = {
        "DV file of another checkpoint": {**delete, "new": {**new, "pathOrInlineDv": older}},
        "DV outside the table": {**delete, "new": {**new, "pathOrInlineDv": "../../x" + stored[-20:]}},
        "absolute DV path": {**delete, "new": {**new, "storageType": "p", "pathOrInlineDv": "/etc/passwd"}},
        "more deleted rows than records": {**delete, "num_records": 1},
        "fewer deleted rows than before": {**delete, "old": {**new, "cardinality": 3}},
        "a newer file": {**delete, "path": "chk-5/j/part-b00001.parquet"},
        "not a file of the sink": {**delete, "path": "chk-2/j/part-00001.parquet"},
    }
    for name, bad in refused.items():
        with pytest.raises(DocumentError):
            sink.check_committables(5, [{"checkpoint_id": 5, "adds": [], "removes": [], "deletes": [bad]}], "d")
            pytest.fail(name)
    with pytest.raises(DocumentError, match="deletion vector files that do not exist"):
        sink.commit(5, [{"checkpoint_id": 5, "adds": [update], "removes": [], "deletes": [delete]}])
    assert not sink.is_committed(5)


def test_another_writers_append_into_an_upsert_table_names_the_way_back(tmp_path):
    """Issue #30 defect 4: a foreign append blocks the upsert with an error that says how to go on, and
    the way it names works: a RESTORE of the table, or of the job when its checkpoints came after."""
    from deltalake import DeltaTable, write_deltalake

    table = tmp_path / "t"
    sink = _sink(table, mode="upsert", keys=["k"], buckets=4)
    sink.commit(1, _committables(1, _staged(table, 1, "part-b00000.parquet")))  # version 1
    assert list(sink._upsert_files()) == ["chk-1/job/step/attempt-1/part-b00000.parquet"]
    write_deltalake(str(table), ROWS, mode="append")  # version 2: not the sink's
    DeltaTable(str(table)).alter.set_table_properties({"delta.appendOnly": "false"})  # version 3
    DeltaTable(str(table)).create_checkpoint()  # the log replay finds the file in the checkpoint of version 3
    with pytest.raises(SinkClaimedError, match=r"version\(s\) \[2\] added 1 file\(s\) this upsert sink did not") as e:
        sink._upsert_files()
    message = str(e.value)
    assert f"DeltaTable('file://{table}').restore(1)" in message and "Another writer in an upsert table" in message
    DeltaTable(str(table)).restore(1)  # as the message says
    assert len(sink._upsert_files()) == 1

    write_deltalake(str(table), ROWS, mode="append")  # version 5, then checkpoint 2 commits on top (version 6)
    sink.commit(2, _committables(2, _staged(table, 2, "part-b00001.parquet")))
    with pytest.raises(SinkClaimedError, match=r"restore the job to checkpoint 1 .* version 1, undoing them and this "):
        sink._upsert_files()
    sink.rollback(1)  # what the job's restore does first
    assert list(sink._upsert_files()) == ["chk-1/job/step/attempt-1/part-b00000.parquet"]


def test_audit_finds_a_file_readers_lost_to_a_same_dv_commit_and_a_restore_repairs_it(tmp_path):
    """A table written before issue #30 was fixed: a commit removed and re-added a file with the same DV,
    so readers dropped it. The audit names it and the checkpoint to restore; the job's restore repairs it."""
    import json
    import time

    from deltalake import DeltaTable

    table = tmp_path / "t"
    sink = _sink(table, mode="upsert", keys=["k"], buckets=4)
    staged = _staged(table, 1, "part-b00000.parquet")
    sink.commit(1, _committables(1, staged))  # version 1
    assert sink.audit() == []
    app_id = sink.app_id()
    bad = {"path": staged["path"], "partitionValues": {}, "size": staged["size"], "dataChange": True}
    actions = [
        {"commitInfo": {"operation": "MERGE", "checkpoint_app_id": app_id, "checkpoint_id": 2}},
        {"txn": {"appId": app_id, "version": 2}},
        {"remove": {**bad, "deletionTimestamp": int(time.time() * 1000)}},
        {"add": {**bad, "modificationTime": int(time.time() * 1000), "stats": json.dumps({"numRecords": 2})}},
    ]
    (table / "_delta_log" / f"{2:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))
    assert DeltaTable(str(table)).to_pyarrow_table().num_rows == 0  # delta-rs drops the file
    (finding,) = sink.audit()
    assert finding.startswith("Delta version 2 removes and re-adds") and "restore the job to checkpoint 1" in finding
    sink.rollback(1)
    assert DeltaTable(str(table)).to_pyarrow_table().num_rows == 2 and sink.audit() == []


def test_an_append_table_gets_a_log_checkpoint_every_interval_and_the_version_is_its_own(tmp_path):
    """Eleven append commits and another writer's among them: a log checkpoint after each of the sink's
    commits (a reader replays none), and each checkpoint's commit is the version the table's history says."""
    from deltalake import DeltaTable, write_deltalake

    from airflow_provider_checkpoint.connectors.delta import commit

    table = tmp_path / "t"
    sink = _sink(table)
    versions = {}
    for checkpoint_id in range(1, 12):
        if checkpoint_id == 6:
            write_deltalake(str(table), ROWS, mode="append")  # another writer: version 6
        sink.commit(checkpoint_id, _committables(checkpoint_id, _staged(table, checkpoint_id)))
        versions[checkpoint_id] = sink.committed_versions()[checkpoint_id]
    assert versions == {c: c if c < 6 else c + 1 for c in range(1, 12)}
    for version in versions.values():
        if version % commit.CHECKPOINT_INTERVAL == 0:
            assert (table / "_delta_log" / f"{version:020d}.checkpoint.parquet").exists()
    assert DeltaTable(str(table)).to_pyarrow_table().num_rows == 2 * 12


def test_commit_then_leaves_the_log_checkpoint_and_leftovers_to_its_caller(tmp_path):
    """Finalize's form of the commit (``commit_then``): the new version is durable and read at once (delta-rs),
    its log checkpoint and another attempt's leftover file come only with the housekeeping returned."""
    from deltalake import DeltaTable

    table = tmp_path / "t"
    sink = _sink(table)
    leftover = _staged(table, 1, "part-other-attempt.parquet")["path"]
    after = sink.commit_then(1, _committables(1, _staged(table, 1)))
    assert sink.is_committed(1) and DeltaTable(str(table)).to_pyarrow_table().num_rows == 2
    log_checkpoint = table / "_delta_log" / f"{1:020d}.checkpoint.parquet"
    assert not log_checkpoint.exists() and (table / leftover).exists()
    assert after is not None
    after()
    assert log_checkpoint.exists() and not (table / leftover).exists()
    assert DeltaTable(str(table)).to_pyarrow_table().num_rows == 2
    again = sink.commit_then(1, _committables(1, _staged(table, 1)))  # committed already: its housekeeping alone
    assert again is not None and sink.committed_versions() == {1: 1}
    leftover = _staged(table, 1, "part-other-attempt.parquet")["path"]
    again()
    assert not (table / leftover).exists() and DeltaTable(str(table)).to_pyarrow_table().num_rows == 2


def _once_before_commit(monkeypatch: pytest.MonkeyPatch, action: Callable[[], None]) -> list[bool]:
    """Run ``action`` once, inside the next commit of any sink, after its idempotence check and before
    it writes (``DeltaTableSink._staged``); the returned list is non-empty once it ran."""
    staged = DeltaTableSink._staged
    ran: list[bool] = []

    def hook(self: DeltaTableSink, checkpoint_id: int) -> dict[str, int]:
        if not ran:
            ran.append(True)
            action()
        return staged(self, checkpoint_id)

    monkeypatch.setattr(DeltaTableSink, "_staged", hook)
    return ran


def test_a_commit_that_lost_the_race_to_another_attempt_commits_nothing(tmp_path, monkeypatch):
    """A finalize that found checkpoint 3 uncommitted, then saw another attempt commit it before its own
    commit, commits nothing: the other commit's ``txn`` is seen (no checkpoint twice in the table)."""
    from deltalake import DeltaTable

    table = tmp_path / "t"
    sink = _sink(table)
    committables = _committables(3, _staged(table, 3))

    def race() -> None:
        other = DeltaTableSink("t", Source("src"), str(table))
        other.claim("job")
        other.commit(3, committables)

    raced = _once_before_commit(monkeypatch, race)
    sink.commit(3, committables)
    assert raced and _log_versions(table) == 2  # the create and the other attempt's commit
    assert DeltaTable(str(table)).to_pyarrow_table().num_rows == 2
    assert sink.committed_versions() == {3: 1}


def test_a_commit_after_another_writers_metadata_change_is_a_conflict(tmp_path, monkeypatch):
    """Another writer's commit changing the table's metadata between the idempotence check and the commit
    fails the commit (Delta's conflict rule, as delta-rs had it); the task's retry commits on top of it."""
    from deltalake import DeltaTable

    from airflow_provider_checkpoint.exceptions import CheckpointStorageError

    table = tmp_path / "t"
    sink = _sink(table)
    committables = _committables(3, _staged(table, 3))

    def change() -> None:
        DeltaTable(str(table)).alter.set_table_properties({"delta.logRetentionDuration": "interval 60 days"})

    _once_before_commit(monkeypatch, change)
    with pytest.raises(CheckpointStorageError, match="metadata or protocol"):
        sink.commit(3, committables)
    assert not sink.is_committed(3)
    sink.commit(3, committables)
    assert sink.committed_versions() == {3: 2}
    assert DeltaTable(str(table)).to_pyarrow_table().num_rows == 2


def test_an_append_commit_refuses_a_table_partitioned_otherwise(tmp_path):
    """The table's partition columns (from the log's replayed metaData) must be the sink's."""
    table = tmp_path / "t"
    sink = _sink(table, partition_by=["k"])
    add = {**_staged(table, 3, "k=a/part-00000.parquet"), "partition_values": {"k": "a"}}
    with pytest.raises(DocumentError, match=r"partitioned by \['k'\].*by \[\]"):
        sink.commit(3, _committables(3, add))
    assert not sink.is_committed(3)


def test_an_append_commit_carries_partition_values_stats_and_the_checkpoint(tmp_path):
    """An append's commit file: ``WRITE`` with the checkpoint's app id and id in ``commitInfo``, its ``txn``,
    and each add with its partition values, ``numRecords`` and ``dataChange``; delta-rs reads it back."""
    import json

    from deltalake import DeltaTable

    table = tmp_path / "t"
    sink = DeltaTableSink("t", Source("src"), str(table), partition_by=["k"])
    sink.claim("job")
    DeltaTable.create(str(table), ROWS.schema, partition_by=["k"])
    relative = "chk-3/job/step/attempt-1/k=a b%3A/part-00000.parquet"
    (table / relative).parent.mkdir(parents=True)
    pq.write_table(ROWS.drop_columns(["k"]), table / relative)
    size = (table / relative).stat().st_size
    add = {"path": relative, "size": size, "num_records": 2, "partition_values": {"k": "a b:"}}
    sink.commit(3, _committables(3, add))
    lines = [json.loads(line) for line in (table / "_delta_log" / f"{1:020d}.json").read_text().splitlines()]
    info, txn, added = (lines[0]["commitInfo"], lines[1]["txn"], lines[2]["add"])
    assert (info["operation"], info["checkpoint_app_id"], info["checkpoint_id"]) == (
        "WRITE",
        "airflow-checkpoint:job:t",
        3,
    )
    assert (txn["appId"], txn["version"]) == ("airflow-checkpoint:job:t", 3)
    assert added["partitionValues"] == {"k": "a b:"} and added["dataChange"] is True
    assert json.loads(added["stats"]) == {"numRecords": 2}
    read = DeltaTable(str(table))
    assert read.transaction_version("airflow-checkpoint:job:t") == 3
    assert read.file_uris() == [str(table / add["path"])]
    assert sorted(read.to_pyarrow_table().column("k").to_pylist()) == ["a b:", "a b:"]


def test_a_staged_file_reached_through_a_link_is_never_committed(tmp_path):
    """Issue #52: a forged add whose staged file is a link (to rows outside, or to a file inside the table,
    its size matching) is refused before the commit; so is one behind a linked directory of ``chk-<id>/``."""
    from deltalake import DeltaTable

    table = tmp_path / "t"
    sink = _sink(table)
    outside = tmp_path / "outside.parquet"
    pq.write_table(pa.table({"k": pa.array(["x", "y", "z"]), "v": pa.array([7, 8, 9], pa.int64())}), outside)
    sink.commit(1, _committables(1, _staged(table, 1)))
    inside = table / _staged(table, 1, "part-00001.parquet")["path"]  # a file of the table the commit did not add
    for name, target in {"to rows outside": outside, "to a file inside the table": inside}.items():
        add = _staged(table, 3)
        (table / add["path"]).unlink()
        (table / add["path"]).symlink_to(target)
        add["size"] = target.stat().st_size
        with pytest.raises(UnsafePathError, match="symbolic link|outside the directory that owns it"):
            sink.commit(3, _committables(3, add))
        assert not sink.is_committed(3) and DeltaTable(str(table)).to_pyarrow_table().num_rows == 2, name
    linked_dir = table / "chk-4" / "job" / "step"
    linked_dir.parent.mkdir(parents=True)
    linked_dir.symlink_to(table / "chk-1" / "job" / "step")  # inside the table: confinement alone passes it
    add = {**_staged(table, 1, "part-00001.parquet"), "path": "chk-4/job/step/attempt-1/part-00001.parquet"}
    with pytest.raises(RefusedInputError):  # the listing does not enter a linked directory: "missing"
        sink.commit(4, _committables(4, add))
    assert not sink.is_committed(4)


def test_a_deletion_vector_reached_through_a_link_is_never_read_or_committed(tmp_path):
    """Issue #52: a valid DV file outside the table, linked in as a checkpoint's new DV, deletes nothing."""
    import fsspec
    import numpy as np
    from deltalake import DeltaTable

    from airflow_provider_checkpoint.connectors.delta.deletion_vectors import new_descriptor_path, write_file

    table = tmp_path / "t"
    sink = _sink(table, mode="upsert", keys=["k"], buckets=4)
    bucket = _staged(table, 1, "part-b00000.parquet")
    sink.commit(1, _committables(1, bucket))
    stored, relative = new_descriptor_path("chk-2/job/step/attempt-1")
    outside = tmp_path / "outside.bin"
    (descriptor,) = write_file(fsspec.filesystem("file"), str(outside), stored, [np.array([0], dtype=np.uint64)])
    (table / relative).parent.mkdir(parents=True)
    (table / relative).symlink_to(outside)
    delete = {
        "path": bucket["path"],
        "size": bucket["size"],
        "num_records": 2,
        "old": None,
        "new": descriptor.to_json(),
    }
    with pytest.raises(UnsafePathError, match="outside the directory that owns it"):
        sink.commit(2, [{"checkpoint_id": 2, "adds": [], "removes": [], "deletes": [delete]}])
    assert not sink.is_committed(2) and DeltaTable(str(table)).to_pyarrow_table().num_rows == 2


def test_the_steps_check_reuses_its_snapshot_only_while_no_commit_came_after_it(tmp_path):
    """``check_staged`` takes the live files the step staged on while the log's latest version is theirs; a
    commit after them (another writer's delete rewriting the file) is replayed, and the staged delete from the
    file it removed is refused: nothing reaches the commit."""
    import fsspec
    import numpy as np
    from deltalake import DeltaTable

    from airflow_provider_checkpoint.connectors.delta import commit as delta_commit
    from airflow_provider_checkpoint.connectors.delta import deletion_vectors
    from airflow_provider_checkpoint.connectors.delta.files import DeltaCommit, DeltaDeletes

    table = tmp_path / "t"
    sink = _sink(table, mode="upsert", keys=["k"], buckets=4)
    sink.commit(1, _committables(1, _staged(table, 1, "part-b00000.parquet")))
    seen = sink._upsert_snapshot()
    (file,) = seen.files.values()
    deletes = [DeltaDeletes(file.path, file.size or 0, 2, None, deletion_vectors.inline(np.array([0], np.uint64)))]
    staged = DeltaCommit([], [], deletes)
    fs = fsspec.filesystem("file")
    delta_commit.check_staged(fs, str(table), "t", 2, staged, seen)  # staged on the latest version: passes
    DeltaTable(str(table)).delete("k = 'b'")  # another writer: the file removed, its other row in a new one
    with pytest.raises(DocumentError, match="does not hold live"):
        delta_commit.check_staged(fs, str(table), "t", 2, staged, seen)
