"""DeltaSource over tables delta-spark (the reference implementation) writes, one per table feature
(issue #53): each is read exactly once across checkpoints — a retry and a concurrent delta-spark
append included — with delta-spark's own reads (the table, its change data feed) or the rows
inserted as the ground truth, or refused with an error naming the feature. docs/delta-lake.md lists the outcome of each.
V2 and multi-part log checkpoints, deletion vectors and ``OPTIMIZE ZORDER`` run in ``make test-full``
(``FULL_TESTS=1``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_checkpoint.dataflow import DeltaSource
from airflow_provider_checkpoint.exceptions import DeltaSourceError
from airflow_provider_checkpoint.storage import JobStorage
from tests.spark.delta_spark import delta_spark_session, sql

from .helpers import step_context

pytestmark = pytest.mark.spark

DVS = "'delta.enableDeletionVectors' = 'true'"
CDF = "'delta.enableChangeDataFeed' = 'true'"


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield from delta_spark_session(tmp_path_factory.mktemp("delta-spark") / "server.log")


def _sorted(rows: Any) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in rows), key=repr)


class Job:
    """One DeltaSource read as a job reads it: a barrier per checkpoint, a retry of each read, and a
    delta-spark append landing between the barrier and the read (the next checkpoint's)."""

    def __init__(self, spark: Any, ds: Any, tmp: Path, path: Path, **options: Any) -> None:
        self.spark, self.ds, self.path = spark, ds, path
        self.source = DeltaSource("src", str(path), **options)
        self.storage = JobStorage.for_job(str(tmp / f"jobs-{path.name}"), "job")
        self.position: Any = None
        self.checkpoint_id = 0

    def _read(self, barrier: Any, columns: list[str]) -> list[tuple[Any, ...]]:
        self.checkpoint_id += 1
        ctx = step_context(self.spark, self.storage, self.checkpoint_id)
        return _sorted(self.source.read(ctx, self.position, barrier).select(*columns).collect())

    def checkpoint(self, columns: list[str], concurrent: Callable[[], None] | None = None) -> list[tuple[Any, ...]]:
        """One checkpoint's rows (``concurrent`` runs after its barrier, before its read)."""
        barrier = self.source.barrier_position(self.position)
        if concurrent is not None:
            concurrent()
        got = self._read(barrier, columns)
        assert self._read(barrier, columns) == got, "a retry read other rows"
        self.position = barrier
        return got

    def drain(self, columns: list[str]) -> list[tuple[Any, ...]]:
        """Checkpoints until the barrier stops moving: their rows together."""
        rows: list[tuple[Any, ...]] = []
        while self.source.barrier_position(self.position) != self.position:
            rows += self.checkpoint(columns)
        return _sorted(rows)


def table(ds: Any, tmp: Path, name: str, columns: str, properties: str = "", clause: str = "") -> tuple[Path, str]:
    """A delta-spark table at ``tmp/name``: its path and its SQL name."""
    path = tmp / name
    at = f"delta.`{path}`"
    tblproperties = f" TBLPROPERTIES ({properties})" if properties else ""
    sql(ds, f"CREATE TABLE {at} ({columns}) USING delta {clause}{tblproperties}")
    return path, at


def current(ds: Any, path: Path, columns: list[str]) -> list[tuple[Any, ...]]:
    return _sorted(ds.read.format("delta").load(str(path)).select(*columns).collect())


def appends_exactly_once(spark: Any, ds: Any, tmp: Path, path: Path, at: str, columns: list[str], **opts: Any) -> Job:
    """Snapshot, then delta-spark appends (one while a checkpoint is under way): the source's rows over
    all checkpoints equal delta-spark's read of the table, each row once."""
    job = Job(spark, ds, tmp, path, **opts)
    got = job.checkpoint(columns)
    assert got == current(ds, path, columns), "the first checkpoint's snapshot differs from delta-spark's read"
    sql(ds, f"INSERT INTO {at} SELECT * FROM {at} LIMIT 3")
    got += job.checkpoint(columns, concurrent=lambda: sql(ds, f"INSERT INTO {at} SELECT * FROM {at} LIMIT 2"))
    got += job.drain(columns)
    assert _sorted(got) == current(ds, path, columns)
    return job


COLUMNS = ["id", "v"]
ROWS = "SELECT id, concat('v', id) AS v FROM range({})"


@pytest.mark.full
def test_deletion_vectors_from_delete_update_merge(spark, ds, tmp_path: Path) -> None:
    """A snapshot applies delta-spark's DVs; without the change data feed a commit removing rows is
    refused naming it; with it, the change rows equal delta-spark's own change data feed row for row —
    a DELETE by deletion vectors (no change files) included: only the rows its new DV deletes."""
    path, at = table(ds, tmp_path, "dvs", "id BIGINT, v STRING", f"{DVS}, {CDF}")
    sql(ds, f"INSERT INTO {at} {ROWS.format(50)}")
    sql(ds, f"DELETE FROM {at} WHERE id % 7 = 0")
    sql(ds, f"UPDATE {at} SET v = 'updated' WHERE id % 5 = 0")
    assert any(a.get("add", {}).get("deletionVector") for a in _actions(path)), "delta-spark wrote no DV"
    plain = Job(spark, ds, tmp_path, path)
    assert plain.checkpoint(COLUMNS) == current(ds, path, COLUMNS)
    changes = Job(spark, ds, tmp_path, path, change_data_feed=True)
    changes.checkpoint([*COLUMNS, "_change_type"])
    start = sql(ds, f"DESCRIBE HISTORY {at} LIMIT 1")[0]["version"]

    sql(ds, f"DELETE FROM {at} WHERE id = 1")
    sql(ds, f"DELETE FROM {at} WHERE id IN (2, 3)")  # DV deletes from files with DVs: only rows 2 and 3
    dv_only = [c for c in _commits(path)[start + 1 :] if not any("cdc" in a for a in c)]
    assert len(dv_only) == 2, "delta-spark wrote change files for its DV deletes: nothing left to check"
    sql(ds, f"MERGE INTO {at} t USING (SELECT id, 'merged' AS v FROM range(45, 55)) s ON t.id = s.id "
            "WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT *")  # fmt: skip
    with pytest.raises(DeltaSourceError, match=r"\(DELETE\) removes"):
        plain.source.barrier_position(plain.position)
    cols = [*COLUMNS, "_change_type", "_commit_version"]
    got = changes.drain(cols)
    reference = ds.read.format("delta").option("readChangeFeed", "true").option("startingVersion", start + 1)
    assert got == _sorted(reference.load(str(path)).select(*cols).collect())
    assert [r for r in got if r[3] == start + 2] == [(2, "v2", "delete", start + 2), (3, "v3", "delete", start + 2)]


def _commits(path: Path) -> list[list[dict[str, Any]]]:
    """The actions of each commit of the table's log, in version order."""
    import json

    return [
        [json.loads(line) for line in commit.read_text().splitlines() if line.strip()]
        for commit in sorted((path / "_delta_log").glob("*.json"))
    ]


def _actions(path: Path) -> list[dict[str, Any]]:
    return [a for commit in _commits(path) for a in commit]


@pytest.mark.parametrize("mode", ["name", "id"])
def test_column_mapping_is_refused_naming_it(spark, ds, tmp_path: Path, mode: str) -> None:
    props = f"'delta.columnMapping.mode' = '{mode}', 'delta.minReaderVersion' = '2', 'delta.minWriterVersion' = '5'"
    path, at = table(ds, tmp_path, f"mapping-{mode}", "id BIGINT, v STRING", props)
    sql(ds, f"INSERT INTO {at} {ROWS.format(5)}")
    sql(ds, f"ALTER TABLE {at} RENAME COLUMN v TO w")
    with pytest.raises(DeltaSourceError, match=f"column mapping \\('{mode}'\\)"):
        Job(spark, ds, tmp_path, path).checkpoint(["id", "w"])


@pytest.mark.full
def test_v2_and_multi_part_checkpoints(spark, ds, tmp_path: Path) -> None:
    """Snapshots at versions whose newest checkpoint is a V2 one with sidecars, or a multi-part one."""
    v2, at_v2 = table(ds, tmp_path, "v2", "id BIGINT, v STRING", "'delta.checkpointPolicy' = 'v2', "
                      "'delta.checkpointInterval' = '2'")  # fmt: skip
    parts, at_parts = table(ds, tmp_path, "parts", "id BIGINT, v STRING", "'delta.checkpointInterval' = '2'")
    ds.conf.set("spark.databricks.delta.checkpoint.partSize", "2")
    try:
        for i in range(5):
            for at in (at_v2, at_parts):
                sql(ds, f"INSERT INTO {at} SELECT id + {10 * i}, concat('v', id) FROM range({3 + i})")
    finally:
        ds.conf.unset("spark.databricks.delta.checkpoint.partSize")
    assert list((v2 / "_delta_log" / "_sidecars").glob("*.parquet")), "delta-spark wrote no sidecar"
    assert len(list((parts / "_delta_log").glob("*.checkpoint.*.*.parquet"))) > 1, "no multi-part checkpoint"
    for path, at in ((v2, at_v2), (parts, at_parts)):
        appends_exactly_once(spark, ds, tmp_path, path, at, COLUMNS)


@pytest.mark.parametrize("layout", [pytest.param("zorder", marks=pytest.mark.full), "liquid"])
def test_optimize_is_not_read_again(spark, ds, tmp_path: Path, layout: str) -> None:
    """OPTIMIZE (liquid clustering, with its domain metadata; ZORDER in ``make test-full``, delta-rs's
    compaction in ``test_delta_source.py``) commits dataChange=false files: every inserted row read once."""
    clause, optimize = (
        ("CLUSTER BY (id)", "OPTIMIZE {at}") if layout == "liquid" else ("", "OPTIMIZE {at} ZORDER BY (id)")
    )
    path, at = table(ds, tmp_path, layout, "id BIGINT, v STRING", clause=clause)
    for i in range(3):
        sql(ds, f"INSERT INTO {at} SELECT id + {100 * i}, concat('v', id) FROM range(20)")
    job = Job(spark, ds, tmp_path, path, starting_version=0)
    got = job.checkpoint(COLUMNS)
    sql(ds, optimize.format(at=at))
    rewrite = _commits(path)[-1]
    assert any("remove" in a for a in rewrite), "OPTIMIZE rewrote nothing: nothing left to check"
    assert all(a["add"]["dataChange"] is False for a in rewrite if "add" in a), rewrite
    sql(ds, f"INSERT INTO {at} SELECT id + 900, 'late' FROM range(4)")
    got += job.drain(COLUMNS)
    inserted = [(i + 100 * k, f"v{i}") for k in range(3) for i in range(20)] + [(900 + i, "late") for i in range(4)]
    assert _sorted(got) == _sorted(inserted)
    if layout == "liquid":
        assert any("domainMetadata" in a for a in _actions(path)), "no domain metadata in the liquid table"


def test_schema_evolution_timestamp_ntz_and_row_tracking(spark, ds, tmp_path: Path) -> None:
    """A column added by a delta-spark append with mergeSchema reads as null in older files; a
    TIMESTAMP_NTZ column reads as the same wall-clock times; a row-tracking table reads its rows."""
    path, at = table(ds, tmp_path, "evolving", "id BIGINT, v STRING, t TIMESTAMP_NTZ",
                     "'delta.enableRowTracking' = 'true'")  # fmt: skip
    sql(ds, f"INSERT INTO {at} SELECT id, concat('v', id), TIMESTAMP_NTZ'2026-03-29 02:30:00' + make_interval(0, 0, "
            "0, 0, id) FROM range(6)")  # fmt: skip
    columns = ["id", "v", "t"]
    job = Job(spark, ds, tmp_path, path)
    got = job.checkpoint(columns)
    assert got == current(ds, path, columns)
    (
        ds.sql("SELECT id + 10 AS id, 'new' AS v, TIMESTAMP_NTZ'1900-01-01 00:00:00' AS t, id AS extra FROM range(3)")
        .write.format("delta")
        .mode("append")
        .option("mergeSchema", "true")
        .save(str(path))
    )
    got_all = [(*r, None) for r in got] + job.drain([*columns, "extra"])
    assert _sorted(got_all) == current(ds, path, [*columns, "extra"])
