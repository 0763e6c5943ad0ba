"""The sink's own Delta log checkpoint without Spark: the replay it is written from, the tables it leaves
to delta-rs, a checkpoint already there kept, ``_last_checkpoint`` only moved forward, tombstones expired
(the comparison with delta-rs's checkpoints and readers: tests/spark/test_delta_log_checkpoint.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_checkpoint.connectors.delta import log as delta_log
from airflow_provider_checkpoint.connectors.delta import log_checkpoint
from airflow_provider_checkpoint.connectors.delta.log_checks import listing
from airflow_provider_checkpoint.connectors.delta.sink import DeltaTableSink
from airflow_provider_checkpoint.dataflow.graph import Source

ROWS = pa.table({"k": pa.array(["a", "b"]), "v": pa.array([1, 2], pa.int64())})
LOCAL = fsspec.filesystem("file")
DAY = 86_400_000


def _replay(path: Path, version: int) -> log_checkpoint.Replay:
    return log_checkpoint.replay(LOCAL, str(path), str(path), version, listing(LOCAL, str(path)))


def test_the_replay_holds_the_live_files_of_live_actions_and_the_tombstones(tmp_path):
    """At every version of a table with appends, overwrites (removes) and a delta-rs checkpoint in between,
    the replay's live files are :func:`.log.live_actions`'s; its tombstones are the removed files."""
    from deltalake import DeltaTable, write_deltalake

    for mode in ("append", "append", "overwrite", "append"):
        write_deltalake(str(tmp_path), ROWS, mode=mode)
    DeltaTable(str(tmp_path)).create_checkpoint()  # at version 3
    for mode in ("overwrite", "append"):
        write_deltalake(str(tmp_path), ROWS, mode=mode)
    for version in range(6):
        state = _replay(tmp_path, version)
        assert state.version == version and state.unsupported is None and state.metadata and state.protocol
        assert state.adds == delta_log.live_actions(LOCAL, str(tmp_path), str(tmp_path), version)
    state = _replay(tmp_path, 5)
    assert len(state.adds) == 2 and len(state.removes) == 3 + 1  # two overwrites, of 3 files and 1
    assert not state.adds.keys() & state.removes.keys()


def test_a_checkpoint_already_there_is_kept_and_last_checkpoint_only_moves_forward(tmp_path):
    from deltalake import DeltaTable, write_deltalake

    for _ in range(3):
        write_deltalake(str(tmp_path), ROWS, mode="append")
    log = tmp_path / "_delta_log"
    state = _replay(tmp_path, 2)
    (log / f"{2:020d}.checkpoint.parquet").write_bytes(b"theirs")
    (log / "_last_checkpoint").write_text('{"version":7,"size":3}')
    assert log_checkpoint.write(LOCAL, str(tmp_path), state)
    assert (log / f"{2:020d}.checkpoint.parquet").read_bytes() == b"theirs"
    assert json.loads((log / "_last_checkpoint").read_text()) == {"version": 7, "size": 3}
    for hint in ("", "not json", '{"version":1,"size":3}', '{"version":"2"}'):
        (log / "_last_checkpoint").write_text(hint)
        (log / f"{2:020d}.checkpoint.parquet").unlink(missing_ok=True)
        assert log_checkpoint.write(LOCAL, str(tmp_path), state)
        last = json.loads((log / "_last_checkpoint").read_text())
        checkpoint = log / f"{2:020d}.checkpoint.parquet"
        assert last == {"version": 2, "size": 5, "sizeInBytes": checkpoint.stat().st_size, "numOfAddFiles": 3}
    assert pq.read_table(checkpoint).num_rows == 5  # protocol, metaData, 3 adds
    assert DeltaTable(str(tmp_path)).to_pyarrow_table().num_rows == 6
    assert not list(log.glob(".*tmp")), "no temporary file is left"


def _state(config: dict[str, str] | None = None, **protocol: Any) -> log_checkpoint.Replay:
    state = log_checkpoint.Replay(3)
    state.protocol = {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["deletionVectors"]}
    state.protocol.update(protocol)
    state.metadata = {"id": "x", "format": {"provider": "parquet"}, "schemaString": "{}", "partitionColumns": []}
    state.metadata["configuration"] = config or {}
    return state


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        (_state(), None),
        (_state(minReaderVersion=1, minWriterVersion=2, readerFeatures=None), None),
        (_state(writerFeatures=["appendOnly", "invariants", "deletionVectors", "variantType"]), None),
        (_state(writerFeatures=["deletionVectors", "domainMetadata"]), "table feature 'domainMetadata'"),
        (_state(writerFeatures=["rowTracking"]), "table feature 'rowTracking'"),
        (_state(readerFeatures=["v2Checkpoint"]), "table feature 'v2Checkpoint'"),
        (_state(readerFeatures=["columnMapping"]), "table feature 'columnMapping'"),
        (_state(minReaderVersion=2, minWriterVersion=5, readerFeatures=None), "reader version 2"),
        (_state({"delta.columnMapping.mode": "name"}), "delta.columnMapping.mode=name"),
        (_state({"delta.enableRowTracking": "true"}), "delta.enableRowTracking=true"),
        (_state({"delta.checkpointPolicy": "v2"}), "delta.checkpointPolicy=v2"),
        (_state({"delta.setTransactionRetentionDuration": "interval 1 days"}), "setTransactionRetention"),
        (_state({"delta.deletedFileRetentionDuration": "a while"}), "is not an interval"),
        (_state({"delta.deletedFileRetentionDuration": "interval 2 days"}), None),
    ],
)
def test_a_table_using_what_we_do_not_write_is_left_to_delta_rs(state, reason):
    got = log_checkpoint.why_not(state)
    assert got is None if reason is None else reason in str(got)


def test_tombstones_older_than_the_retention_are_dropped():
    now = 100 * DAY
    for config, kept in (({}, ["new", "week"]), ({"delta.deletedFileRetentionDuration": "interval 2 days"}, ["new"])):
        state = _state(config)
        for name, age in (("new", 1), ("week", 6), ("old", 8)):
            state.removes[(name, None)] = {"path": name, "deletionTimestamp": now - age * DAY, "dataChange": True}
        removes = [a["remove"]["path"] for a in log_checkpoint.actions(state, now) if "remove" in a]
        assert removes == kept


def test_the_sink_leaves_a_table_with_domain_metadata_to_delta_rs(tmp_path, caplog):
    """A table whose protocol has a writer feature this writer does not write (domain metadata): its log
    checkpoint is delta-rs's, holding the domain metadata."""
    from deltalake import DeltaTable

    sink = DeltaTableSink("t", Source("src"), str(tmp_path))
    sink.claim("job")
    DeltaTable.create(str(tmp_path), ROWS.schema)
    protocol = {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": [],
        "writerFeatures": ["domainMetadata"],
    }
    actions = [
        {"commitInfo": {"timestamp": 1, "operation": "SET TBLPROPERTIES"}},
        {"protocol": protocol},
        {"domainMetadata": {"domain": "app.x", "configuration": "{}", "removed": False}},
    ]
    (tmp_path / "_delta_log" / f"{1:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))
    relative = "chk-1/job/step/attempt-1/part-00000.parquet"
    (tmp_path / relative).parent.mkdir(parents=True)
    pq.write_table(ROWS, tmp_path / relative)
    add = {"path": relative, "size": (tmp_path / relative).stat().st_size, "num_records": 2, "partition_values": {}}
    with caplog.at_level(logging.INFO):
        sink.commit(1, [{"checkpoint_id": 1, "adds": [add], "removes": []}])
    assert "log checkpoint of version 2 by delta-rs (commit 1 holds a 'domainMetadata' action)" in caplog.text
    checkpoint = pq.read_table(tmp_path / "_delta_log" / f"{2:020d}.checkpoint.parquet")
    assert [d for d in checkpoint.column("domainMetadata").to_pylist() if d] == [actions[2]["domainMetadata"]]
    assert DeltaTable(str(tmp_path)).to_pyarrow_table().num_rows == 2


def test_actions_that_do_not_fit_a_checkpoint_are_left_to_delta_rs(tmp_path):
    """Another writer's add without a field a checkpoint requires (or of the wrong type) is not written as a
    checkpoint with a null or a guess in it: the table's checkpoint is left to delta-rs."""
    from deltalake import write_deltalake

    write_deltalake(str(tmp_path), ROWS, mode="append")
    for bad in ({"modificationTime": None}, {"size": "12"}):
        state = _replay(tmp_path, 0)
        ((key, (v, add)),) = state.adds.items()
        state.adds[key] = (v, {**add, **bad})
        assert not log_checkpoint.write(LOCAL, str(tmp_path), state)
        assert "do not fit a checkpoint" in str(log_checkpoint.why_not(state))
        assert not list((tmp_path / "_delta_log").glob("*.checkpoint.parquet"))


def test_text_and_null_partition_values_survive_the_checkpoint(tmp_path):
    """Partition values with quotes, a newline, non-ASCII text and a null are in the checkpoint as the commits
    hold them, and delta-rs reads the table from that checkpoint alone (the commits before it deleted)."""
    from deltalake import DeltaTable, write_deltalake

    values = ['q"uote', "two\nlines", "üñí €😀", None]
    rows = pa.table({"k": pa.array(values), "v": pa.array([1, 2, 3, 4], pa.int64())})
    for _ in range(2):
        write_deltalake(str(tmp_path), rows, mode="append", partition_by=["k"])
    assert log_checkpoint.write(LOCAL, str(tmp_path), _replay(tmp_path, 1))
    log = tmp_path / "_delta_log"
    checkpoint = pq.read_table(log / f"{1:020d}.checkpoint.parquet")
    written = sorted((a["path"], dict(a["partitionValues"])) for a in checkpoint.column("add").to_pylist() if a)
    live = delta_log.live_actions(LOCAL, str(tmp_path), str(tmp_path), 1)
    assert written == sorted((a["path"], a["partitionValues"]) for _, a in live.values())
    (log / f"{0:020d}.json").unlink()
    read = DeltaTable(str(tmp_path)).to_pyarrow_table().to_pylist()
    assert sorted(repr((r["k"], r["v"])) for r in read) == sorted(
        [*map(repr, zip(values, [1, 2, 3, 4], strict=True))] * 2
    )


def test_a_checkpoint_is_written_without_importing_pandas(tmp_path):
    """Encoding a checkpoint builds no Arrow array from Python objects (``pa.array`` imports pandas, a
    quarter to half a second of a finalize task that needs no pandas)."""
    import subprocess
    import sys

    from deltalake import write_deltalake

    write_deltalake(str(tmp_path), ROWS, mode="append", partition_by=["k"])
    code = (
        "import sys, fsspec\n"
        "from airflow_provider_checkpoint.connectors.delta import log_checkpoint\n"
        "from airflow_provider_checkpoint.connectors.delta.log_checks import listing\n"
        "fs, root = fsspec.filesystem('file'), sys.argv[1]\n"
        "state = log_checkpoint.replay(fs, root, root, 0, listing(fs, root))\n"
        "assert log_checkpoint.write(fs, root, state), log_checkpoint.why_not(state)\n"
        "print(sorted(m for m in ('pandas', 'pyarrow.dataset') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
    assert (tmp_path / "_delta_log" / f"{0:020d}.checkpoint.parquet").exists()
