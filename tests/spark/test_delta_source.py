"""DeltaSource on real Spark over tables written by delta-rs: each checkpoint's rows equal pandas over
the frames written in its range; retries read the same rows; change data feed; vacuumed tables."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql.types import StructType

from airflow_provider_checkpoint.connectors.delta.log import DataFile
from airflow_provider_checkpoint.dataflow import DeltaSource, KeyedAggregate, ParquetTableSink
from airflow_provider_checkpoint.exceptions import DeltaSourceError
from airflow_provider_checkpoint.hooks.checkpoint import CheckpointStorageHook
from airflow_provider_checkpoint.restore.requests import request_restore
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.testing.clickstream import read_table
from airflow_provider_checkpoint.testing.inprocess import make_job

from .helpers import step_context

pytestmark = pytest.mark.spark


def frame(start: int, n: int, days: tuple[str, ...] = ("2026-11-01", "2026 11 02")) -> pd.DataFrame:
    """``n`` rows with keys from ``start``; a partition value with a space tests path encoding."""
    return pd.DataFrame(
        {
            "k": range(start, start + n),
            "v": [f"v{i}" for i in range(start, start + n)],
            "day": [days[i % 2] for i in range(n)],
        }
    )


def append(path: Path, df: pd.DataFrame, **kwargs: Any) -> None:
    write_deltalake(
        str(path), pa.Table.from_pandas(df, preserve_index=False), mode="append", partition_by=["day"], **kwargs
    )


def rows(df: Any) -> pd.DataFrame:
    """A Spark or pandas frame as sorted pandas rows (the source's output order is not defined)."""
    pdf = df.toPandas() if hasattr(df, "toPandas") else df
    columns = sorted(pdf.columns)
    return pdf[columns].sort_values(columns, ignore_index=True).astype({"k": "int64"})


class Reader:
    """Reads ranges of one source the way the step does, one step context per checkpoint."""

    def __init__(self, spark: Any, tmp_path: Path, source: DeltaSource) -> None:
        self.spark, self.source, self.checkpoint = spark, source, 0
        self.storage = JobStorage.for_job(str(tmp_path / "checkpoints"), "job")

    def read(self, previous: Any, barrier: Any) -> pd.DataFrame:
        self.checkpoint += 1
        return rows(self.source.read(step_context(self.spark, self.storage, self.checkpoint), previous, barrier))


def test_appends_read_exactly_once_per_range_with_compaction_and_backlog_split(spark, tmp_path: Path) -> None:
    table = tmp_path / "table"
    written = [frame(0, 6)]
    append(table, written[0])
    source = DeltaSource("src", str(table), max_commits_per_checkpoint=2)
    reader = Reader(spark, tmp_path, source)

    first = source.barrier_position(None)
    assert first["version"] == 0
    pd.testing.assert_frame_equal(reader.read(None, first), rows(written[0]), check_dtype=False)

    for i in range(1, 4):
        written.append(frame(100 * i, 3 + i))
        append(table, written[i])
    DeltaTable(str(table)).optimize.compact()  # version 4: dataChange=false, not read again
    append(table, written_last := frame(900, 2))

    previous, got = first, []
    while (barrier := source.barrier_position(previous)) != previous:
        got.append(reader.read(previous, barrier))
        previous = barrier
    assert previous["version"] == 5
    assert [len(g) for g in got] == [len(written[1]) + len(written[2]), len(written[3]), len(written_last)]
    truth = rows(pd.concat([*written[1:], written_last]))
    pd.testing.assert_frame_equal(rows(pd.concat(got)), truth, check_dtype=False)


def test_a_retry_reads_the_same_rows_whatever_was_committed_since(spark, tmp_path: Path) -> None:
    table = tmp_path / "table"
    append(table, frame(0, 4))
    source = DeltaSource("src", str(table), starting_version=0)
    reader = Reader(spark, tmp_path, source)
    append(table, frame(10, 5))
    barrier = source.barrier_position(None)
    first_attempt = reader.read(None, barrier)
    append(table, frame(20, 7))  # after the barrier: the next checkpoint's
    pd.testing.assert_frame_equal(reader.read(None, barrier), first_attempt)
    pd.testing.assert_frame_equal(first_attempt, rows(pd.concat([frame(0, 4), frame(10, 5)])), check_dtype=False)


def test_change_data_feed_reads_inserts_updates_and_deletes(spark, tmp_path: Path) -> None:
    """Against pandas over the operations, and delta-rs's own change feed (which cannot read a
    partition value with a space: plain ones here)."""
    table, days = tmp_path / "table", ("d1", "d2")
    append(table, frame(0, 4, days), configuration={"delta.enableChangeDataFeed": "true"})
    source = DeltaSource("src", str(table), change_data_feed=True)
    reader = Reader(spark, tmp_path, source)
    first = source.barrier_position(None)
    snapshot = reader.read(None, first)
    assert set(snapshot["_change_type"]) == {"insert"} and set(snapshot["_commit_version"]) == {0}

    DeltaTable(str(table)).update(updates={"v": "'changed'"}, predicate="k = 1")  # version 1
    DeltaTable(str(table)).delete("k = 2")  # version 2
    append(table, frame(50, 2, days))  # version 3
    barrier = source.barrier_position(first)
    got = reader.read(first, barrier)

    base = frame(0, 4, days).set_index("k")
    change = [
        ("update_preimage", 1, base.loc[[1]]),
        ("update_postimage", 1, base.loc[[1]].assign(v="changed")),
        ("delete", 2, base.loc[[2]]),
        ("insert", 3, frame(50, 2, days).set_index("k")),
    ]
    truth = pd.concat(
        [df.reset_index().assign(_change_type=kind, _commit_version=version) for kind, version, df in change]
    )
    pd.testing.assert_frame_equal(got, rows(truth), check_dtype=False)
    cdf = pa.table(DeltaTable(str(table)).load_cdf(starting_version=1, ending_version=3).read_all()).to_pandas()
    pd.testing.assert_frame_equal(got, rows(cdf.drop(columns="_commit_timestamp")), check_dtype=False)


def test_a_delete_without_change_data_feed_is_refused_naming_the_commit(spark, tmp_path: Path) -> None:
    table = tmp_path / "table"
    append(table, frame(0, 4))
    source = DeltaSource("src", str(table))
    first = source.barrier_position(None)
    DeltaTable(str(table)).delete("k = 1")
    with pytest.raises(DeltaSourceError, match=r"commit 1 \(DELETE\) removes 1 file"):
        source.barrier_position(first)


def test_without_recorded_change_data_whole_files_are_the_net_change(spark, tmp_path: Path) -> None:
    """A writer without delta.enableChangeDataFeed rewrites files: the removed file's rows come out as
    deletes, the added file's as inserts, and their signed sum per row is the actual change."""
    table = tmp_path / "table"
    append(table, frame(0, 6))
    source = DeltaSource("src", str(table), change_data_feed=True)
    reader = Reader(spark, tmp_path, source)
    first = source.barrier_position(None)
    DeltaTable(str(table)).delete("k = 1")
    DeltaTable(str(table)).update(updates={"v": "'changed'"}, predicate="k = 4")
    got = reader.read(first, source.barrier_position(first))
    assert set(got["_change_type"]) == {"insert", "delete"} and set(got["_commit_version"]) == {1, 2}
    signed = got.assign(sign=got["_change_type"].map({"insert": 1, "delete": -1}))
    net = signed.groupby(["k", "v", "day"], as_index=False)["sign"].sum().query("sign != 0")
    before, after = frame(0, 6), frame(0, 6).query("k != 1").assign(v=lambda d: d["v"].where(d["k"] != 4, "changed"))
    truth = pd.concat([before.assign(sign=-1), after.assign(sign=1)]).groupby(["k", "v", "day"], as_index=False)["sign"]
    pd.testing.assert_frame_equal(
        net.reset_index(drop=True), truth.sum().query("sign != 0").reset_index(drop=True), check_dtype=False
    )


def test_a_table_vacuumed_past_the_position_is_refused_naming_the_versions(spark, tmp_path: Path) -> None:
    table = tmp_path / "table"
    append(table, frame(0, 4))
    source = DeltaSource("src", str(table))
    reader = Reader(spark, tmp_path, source)
    first = source.barrier_position(None)
    append(table, frame(10, 4))
    barrier = source.barrier_position(first)
    DeltaTable(str(table)).optimize.compact()
    DeltaTable(str(table)).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    with pytest.raises(DeltaSourceError, match=r"vacuumed past this job's position: \d+ file\(s\) of versions 1\.\.1"):
        reader.read(first, barrier)

    DeltaTable(str(table)).create_checkpoint()  # the log cleaned up past the position, as log retention does
    for version in (0, 1):
        (table / "_delta_log" / f"{version:020d}.json").unlink()
    with pytest.raises(DeltaSourceError, match="commit 1 is no longer in its log .its oldest commit is 2"):
        source.barrier_position(first)


def test_a_replaced_table_is_refused(spark, tmp_path: Path) -> None:
    table = tmp_path / "table"
    append(table, frame(0, 4))
    source = DeltaSource("src", str(table))
    first = source.barrier_position(None)
    shutil.rmtree(table)
    append(table, frame(0, 2))
    append(table, frame(5, 2))
    with pytest.raises(DeltaSourceError, match="was replaced"):
        source.barrier_position(first)


def test_a_pipeline_over_a_delta_table_counts_every_commit_once(spark, tmp_path: Path, monkeypatch) -> None:
    """DeltaSource → KeyedAggregate → upsert table over checkpoints, commits landing mid-checkpoint,
    a step retry and a restore to checkpoint 1: the table equals pandas over every frame written."""
    table = tmp_path / "source"
    written = [frame(0, 8)]
    append(table, written[0])

    def declare(base: Path) -> None:
        rows_in = DeltaSource("rows", str(table))
        totals = KeyedAggregate("per_day", rows_in, keys=["day"], aggs={"n": "count", "top": "max(k)"})
        ParquetTableSink("per_day_table", totals, f"{base}/per_day", mode="upsert", keys=["day"])

    job = make_job(spark, tmp_path, declare)

    def land() -> None:
        written.append(frame(100 * len(written), 5))
        append(table, written[-1])

    job.checkpoint(during=land)
    land()
    monkeypatch.setenv("CHECKPOINT_FAULTS", "step.before_ack:checkpoint=2:attempt=1")
    job.checkpoint(during=land)
    monkeypatch.delenv("CHECKPOINT_FAULTS")
    job.checkpoint()
    land()
    request_restore(job.storage, job.storage.url(job.storage.chk_dir(1)), False, False)
    restored = job.checkpoint()  # state and position of checkpoint 1: its later commits are read again, once
    assert restored.restored_from == 1
    everything = pd.concat(written)
    truth = everything.groupby("day").agg(n=("k", "count"), top=("k", "max")).reset_index()
    got = read_table(tmp_path / "per_day")[["day", "n", "top"]].sort_values("day", ignore_index=True)
    pd.testing.assert_frame_equal(got, truth.sort_values("day", ignore_index=True), check_dtype=False)
    assert [r for r in job.step_runs if r[2] > 1], "the injected fault made a step retry"
    sensor = CheckpointStorageHook(job.storage.job_id, f"file://{tmp_path}/ckpt")
    assert sensor.new_input(job.graph.sources) == [], "every commit is read"
    land()
    assert sensor.new_input(job.graph.sources) == ["rows"]


def test_files_with_the_same_base_name_keep_their_own_partition_values(spark, tmp_path: Path) -> None:
    """The per-file values are looked up by base name: files sharing one are read in separate scans."""
    for day, start in (("d1", 0), ("d2", 10)):
        (tmp_path / f"day={day}").mkdir()
        pq.write_table(pa.Table.from_pandas(frame(start, 3)[["k", "v"]]), tmp_path / f"day={day}" / "part-0.parquet")
    files = [DataFile(f"day={day}/part-0.parquet", (("day", day),)) for day in ("d1", "d2")]
    schema = StructType.fromDDL("k LONG, v STRING, day STRING")
    got = DeltaSource("src", str(tmp_path))._scan().load(spark, schema, ["day"], files)
    truth = pd.concat([frame(0, 3).assign(day="d1"), frame(10, 3).assign(day="d2")])
    pd.testing.assert_frame_equal(rows(got), rows(truth), check_dtype=False)


def test_an_upsert_table_with_deletion_vectors_reads_as_its_changes(spark, tmp_path: Path, monkeypatch) -> None:
    """Our DeltaTableSink's upserts give files new DVs: the snapshot leaves the deleted rows out, and
    a later range's change rows are exactly the replaced rows deleted and the new ones inserted (a file
    re-added with a new DV changes only in the rows that DV adds); they sum to the difference of the
    table's states (pandas)."""
    from airflow_provider_checkpoint.dataflow import DeltaTableSink, FileSource

    table = tmp_path / "latest"
    sink = DeltaTableSink("t", FileSource("s", "/none", "json", "x STRING"), str(table), "upsert", ["k"], buckets=2)
    storage = JobStorage.for_job(str(tmp_path / "sink"), "job")
    state = pd.DataFrame({"k": range(40), "v": [f"a{i}" for i in range(40)]})

    def upsert(checkpoint_id: int, changed: pd.DataFrame) -> pd.DataFrame:
        ctx = step_context(spark, storage, checkpoint_id)
        sink.commit(checkpoint_id, sink.stage(ctx, spark.createDataFrame(changed)))
        return pd.concat([state[~state.k.isin(changed.k)], changed])

    state = upsert(1, state)
    state = upsert(2, pd.DataFrame({"k": [3, 5, 40], "v": ["b3", "b5", "b40"]}))
    source = DeltaSource("src", str(table), change_data_feed=True)
    reader = Reader(spark, tmp_path, source)
    first = source.barrier_position(None)
    snapshot = reader.read(None, first)
    assert set(snapshot["_change_type"]) == {"insert"}
    pd.testing.assert_frame_equal(
        snapshot[["k", "v"]].reset_index(drop=True), rows(state)[["k", "v"]], check_dtype=False
    )
    before = state
    state = upsert(3, pd.DataFrame({"k": [5, 7, 41], "v": ["c5", "c7", "c41"]}))
    state = upsert(4, pd.DataFrame({"k": [7, 8], "v": ["d7", "d8"]}))
    got = reader.read(first, source.barrier_position(first))
    assert sorted(zip(got["k"], got["v"], got["_change_type"], strict=True)) == [
        (5, "b5", "delete"), (5, "c5", "insert"), (7, "a7", "delete"), (7, "c7", "delete"), (7, "c7", "insert"),
        (7, "d7", "insert"), (8, "a8", "delete"), (8, "d8", "insert"), (41, "c41", "insert"),
    ]  # fmt: skip
    signed = got.assign(sign=got["_change_type"].map({"insert": 1, "delete": -1}))
    net = signed.groupby(["k", "v"], as_index=False)["sign"].sum().query("sign != 0")
    truth = pd.concat([before.assign(sign=-1), state.assign(sign=1)]).groupby(["k", "v"], as_index=False)["sign"]
    pd.testing.assert_frame_equal(
        net.reset_index(drop=True), truth.sum().query("sign != 0").reset_index(drop=True), check_dtype=False
    )


@pytest.mark.parametrize("link", ["a data file", "a partition directory", "a DV file", "a commit"])
def test_a_source_table_linking_out_is_refused_before_spark_or_pyarrow_reads(
    spark, tmp_path: Path, monkeypatch, link: str
) -> None:
    """A data file, a directory of them, or a DV file of the log replaced by a link out of the table (it would
    decide which rows Spark reads, or which are dropped), or a link inside ``_delta_log``: the read is refused
    with :class:`UnsafePathError`; nothing outside is touched."""
    import hashlib
    import shutil

    from airflow_provider_checkpoint.dataflow import DeltaTableSink, FileSource
    from airflow_provider_checkpoint.exceptions import UnsafePathError

    table, outside = tmp_path / "table", tmp_path / "outside"
    outside.mkdir()
    if link == "a DV file":
        sink = DeltaTableSink("t", FileSource("s", "/none", "json", "x STRING"), str(table), "upsert", ["k"], buckets=2)
        storage = JobStorage.for_job(str(tmp_path / "sink"), "job")
        for c, keys in ((1, range(40)), (2, [3, 5])):
            batch = pd.DataFrame({"k": list(keys), "v": [f"v{c}" for _ in keys]})
            sink.commit(c, sink.stage(step_context(spark, storage, c), spark.createDataFrame(batch)))
        target = next(table.rglob("deletion_vector_*.bin"))
    else:
        append(table, frame(0, 4))
        partition = next(p for p in table.iterdir() if p.name.startswith("day="))
        target = {
            "a data file": next(partition.glob("*.parquet")),
            "a partition directory": partition,
            "a commit": table / "_delta_log" / f"{0:020d}.json",
        }[link]
    shutil.move(target, outside / target.name)
    target.symlink_to(outside / target.name)
    digest = {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in outside.rglob("*") if p.is_file()}
    source = DeltaSource("src", str(table))
    with pytest.raises(UnsafePathError, match=r"symbolic link|resolves to"):
        Reader(spark, tmp_path, source).read(None, source.barrier_position(None))
    assert {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in outside.rglob("*") if p.is_file()} == digest


@pytest.mark.parametrize("where", ["a line", "a stats string"])
def test_a_log_nested_too_deep_is_refused_before_delta_rs_parses_it(spark, tmp_path: Path, where: str) -> None:
    """A commit nesting 100,000 deep (delta-rs 1.6.6 dies with SIGSEGV parsing such stats) is refused with
    a :class:`DocumentError` naming the file, and the process lives on."""
    from airflow_provider_checkpoint.exceptions import DocumentError

    table = tmp_path / "table"
    append(table, frame(0, 4))
    deep = "[" * 100_000 + "]" * 100_000
    stats = deep if where == "a line" else json.dumps(deep)
    add = '{"add":{"path":"x.parquet","size":1,"modificationTime":1,"dataChange":true,"partitionValues":{},'
    (table / "_delta_log" / f"{1:020d}.json").write_text(f'{add}"stats":{stats}}}}}\n')
    source = DeltaSource("src", str(table))
    with pytest.raises(DocumentError, match=r"00000000000000000001\.json.*(not valid JSON|nests deeper)"):
        source.barrier_position(None)


def test_a_stored_position_ahead_of_the_table_is_refused(spark, tmp_path: Path) -> None:
    """A position 10^6 versions past the table's latest (a crafted or foreign ``_metadata``) would skip every
    commit up to it silently: the barrier refuses it, naming both versions."""
    from airflow_provider_checkpoint.exceptions import InvalidPositionError

    table = tmp_path / "table"
    append(table, frame(0, 4))
    append(table, frame(4, 4))
    source = DeltaSource("src", str(table))
    assert source.barrier_position({"version": 1})["version"] == 1  # caught up: nothing to read
    with pytest.raises(InvalidPositionError, match=r"version 1000001\) is ahead .* latest version is 1"):
        source.barrier_position({"version": 1_000_001})
