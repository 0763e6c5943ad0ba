"""A Parquet upsert table whose input gains a column, over several checkpoints that touch some buckets and
leave others: with the default ``schema_evolution="none"`` the step refuses the column before anything is
staged (naming the table, the column and ``schema_evolution='additive'``); with ``"additive"`` every bucket
file has the column from its checkpoint on, and the table read back by pyarrow, DuckDB, Spark (each taking one
file's schema) and Spark with ``mergeSchema`` equals a model of the upserts, with the driver merge and the
Spark merge alike, and across a restore to a checkpoint before the column."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from airflow_provider_checkpoint.connectors.files.parquet_sink import ParquetTableSink
from airflow_provider_checkpoint.dataflow import FileSource
from airflow_provider_checkpoint.dataflow.graph import Source
from airflow_provider_checkpoint.restore.requests import request_restore
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.testing.inprocess import make_job
from tests.spark.helpers import refused_stage, staged_and_committed, step_context, write_json

pytestmark = pytest.mark.spark

BUCKETS = 4
Model = dict[str, tuple[Any, Any]]
"""What the table must hold: key → (v, w), ``w`` null where no row of the key carried it."""


def buckets_of(spark: Any, keys: list[str]) -> dict[int, list[str]]:
    """The keys of each bucket, by Spark's hash as the sink buckets them."""
    from pyspark.sql import functions as F

    df = spark.createDataFrame([(k,) for k in keys], "k string")
    found: dict[int, list[str]] = {}
    for row in df.select("k", F.pmod(F.xxhash64("k"), F.lit(BUCKETS)).alias("b")).collect():
        found.setdefault(int(row.b), []).append(row.k)
    return {b: sorted(ks) for b, ks in found.items()}


def read_back(spark: Any, path: Path, merge_schema: bool) -> dict[str, Model]:
    """The table as pyarrow, DuckDB and Spark read it taking one file's schema (no unification), and (if
    ``merge_schema``) as Spark reads it with ``mergeSchema``, each by key; one row per key."""

    def by_key(rows: list[dict[str, Any]]) -> Model:
        found = {r["k"]: (r["v"], r.get("w")) for r in rows}
        assert len(found) == len(rows), "one row per key"
        return found

    scan = duckdb.connect().sql(f"SELECT * FROM read_parquet('{path}/part-*.parquet')")
    reads = {
        "pyarrow": by_key(pads.dataset(str(path), format="parquet").to_table().to_pylist()),
        "duckdb": by_key([dict(zip(scan.columns, row, strict=True)) for row in scan.fetchall()]),
        "spark": by_key([r.asDict() for r in spark.read.parquet(str(path)).collect()]),
    }
    if merge_schema:
        merged = spark.read.option("mergeSchema", "true").parquet(str(path))
        reads["spark mergeSchema"] = by_key([r.asDict() for r in merged.collect()])
    return reads


def assert_holds(spark: Any, path: Path, model: Model, merge_schema: bool = False) -> None:
    for reader, got in read_back(spark, path, merge_schema).items():
        assert got == model, f"{reader} reads the table unlike the model"


@pytest.mark.parametrize("driver_merge_rows", [1000, 0], ids=["driver-merge", "spark-merge"])
def test_an_added_column_reaches_every_bucket_and_every_reader_with_additive(
    spark: Any, tmp_path: Path, driver_merge_rows: int
) -> None:
    """Checkpoint 2 brings ``w`` touching bucket 1 only; 3 touches half of bucket 0 (filled, no ``w`` value)
    and the other half of bucket 1 (its kept rows hold checkpoint 2's values); 4 touches buckets 2 and 3 and
    adds keys. A merge reading old files of two schemas would keep one schema's columns."""
    path = tmp_path / "table"
    storage = JobStorage.for_job(str(tmp_path / "jobs"), "job")
    sink = ParquetTableSink(
        "out", Source("src"), str(path), "upsert", ["k"], buckets=BUCKETS,
        driver_merge_rows=driver_merge_rows, schema_evolution="additive",
    )  # fmt: skip
    keys = [f"k{i:02d}" for i in range(32)]
    bucket = buckets_of(spark, keys)
    assert all(len(bucket.get(b, [])) >= 4 for b in range(BUCKETS)), "every bucket holds keys to touch and keys to keep"
    half = {b: ks[: len(ks) // 2] for b, ks in bucket.items()}
    other = {b: ks[len(ks) // 2 :] for b, ks in bucket.items()}
    checkpoints: list[list[tuple[Any, ...]]] = [
        [(k, i) for i, k in enumerate(keys)],
        [(k, 200 + i, f"w2-{k}") for i, k in enumerate(half[1])],
        [(k, 300 + i, None) for i, k in enumerate(half[0])] + [(k, 310 + i, f"w3-{k}") for i, k in enumerate(other[1])],
        [(k, 400 + i, f"w4-{k}") for i, k in enumerate(half[2] + other[3] + ["new-1", "new-2"])],
    ]
    model: Model = {}
    for checkpoint_id, rows in enumerate(checkpoints, start=1):
        schema = "k string, v long" + (", w string" if len(rows[0]) == 3 else "")
        ctx = step_context(spark, storage, checkpoint_id)
        sink.prepare(ctx)
        sink.commit(checkpoint_id, sink.stage(ctx, spark.createDataFrame(rows, schema)))
        model.update({r[0]: (r[1], r[2] if len(r) == 3 else None) for r in rows})
        if checkpoint_id > 1:
            names = {tuple(pq.read_schema(f).names) for f in path.glob("part-*.parquet")}
            assert names == {("k", "v", "w")}, "every bucket file has the table's whole schema"
        assert_holds(spark, path, model, merge_schema=checkpoint_id == len(checkpoints))
    assert not list(path.glob("_staging/**/*.parquet")), "nothing left staged"


def test_none_refuses_an_added_or_a_missing_column_before_anything_is_staged(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "table"
    sink = ParquetTableSink("out", Source("src"), str(path), "upsert", ["id"], buckets=2, driver_merge_rows=0)
    storage = JobStorage.for_job(str(tmp_path / "jobs"), "job")
    staged_and_committed(spark, sink, storage, 1, [(i, f"v{i}") for i in range(6)], "id long, v string")

    for checkpoint_id, (rows, schema, problem) in enumerate(
        [
            ([(1, "changed", "x")], "id long, v string, note string", r"added column\(s\) \['note'\]"),
            ([(1,)], "id long", r"missing column\(s\) \['v'\]"),
        ],
        start=2,
    ):
        refused = refused_stage(spark, sink, storage, checkpoint_id, rows, schema, problem)
        assert f"Parquet table {sink.asset_uri()}" in refused
        assert "schema_evolution='additive'" in refused or "missing" in problem
        rows_now = pads.dataset(str(path), format="parquet").to_table().to_pylist()
        assert sorted((r["id"], r["v"]) for r in rows_now) == [(i, f"v{i}") for i in range(6)]
        assert {tuple(r) for r in rows_now} == {("id", "v")}


def test_a_restore_to_a_checkpoint_before_an_added_column_replays_into_the_whole_schema(
    spark: Any, tmp_path: Path
) -> None:
    """Checkpoints 1 and 2 without ``w``; the pipeline redeployed with ``w`` declared, checkpoint 3 adds it
    (every bucket file filled); a restore to checkpoint 2 with the pipeline of before the column (as after a
    CDC ``ADD COLUMN`` undone upstream) replays checkpoint 3's file without ``w`` with the next one: the table
    keeps the column and each key its value in it (Delta's ``MERGE … UPDATE SET *``), new keys null; then the
    pipeline with ``w`` again. Read back, it equals the model of every file upserted in landing order."""
    landing, path = tmp_path / "landing", tmp_path / "table"

    def pipeline(columns: str) -> Any:
        def declare(tmp: Path) -> None:
            source = FileSource("src", str(landing), "json", columns)
            ParquetTableSink("out", source, str(path), "upsert", ["k"], buckets=BUCKETS, schema_evolution="additive")

        return declare

    model: Model = {}

    def land(n: int, rows: list[dict[str, Any]], columns: str = "k STRING, v LONG, w STRING") -> None:
        write_json(landing / f"f{n:02d}.json", rows)
        kept = {k: w for k, (_, w) in model.items()} if "w" not in columns else {}  # the table's values
        model.update({r["k"]: (r["v"], r.get("w", kept.get(r["k"]))) for r in rows})

    keys = [f"k{i:02d}" for i in range(32)]
    bucket = buckets_of(spark, keys)  # checkpoint 3 touches buckets 0 and 1, the later ones 0 to 2: 3 is filled
    assert all(len(bucket.get(b, [])) >= 2 for b in range(BUCKETS))
    job = make_job(spark, tmp_path, pipeline("k STRING, v LONG"))
    land(1, [{"k": k, "v": i} for i, k in enumerate(keys)])
    job.checkpoint()
    land(2, [{"k": k, "v": 100 + i} for i, k in enumerate(keys[:6])])
    job.checkpoint()
    assert_holds(spark, path, model)
    before_column = dict(model)

    evolved = make_job(spark, tmp_path, pipeline("k STRING, v LONG, w STRING"))
    evolved.checkpoints = job.checkpoints  # the same job, redeployed: its runs go on numbering
    land(3, [{"k": k, "v": 200 + i, "w": f"w3-{k}"} for i, k in enumerate(bucket[0][:2] + bucket[1])])
    evolved.checkpoint()
    assert_holds(spark, path, model)

    request_restore(evolved.storage, evolved.storage.url(evolved.storage.chk_dir(2)), False, False)
    before = make_job(spark, tmp_path, pipeline("k STRING, v LONG"))
    before.checkpoints = job.checkpoints
    land(4, [{"k": k, "v": 300 + i} for i, k in enumerate(bucket[1][1:] + bucket[2][:1] + ["new"])], "k STRING, v LONG")
    restored = before.checkpoint()
    assert restored.checkpoint_id == 4
    assert_holds(spark, path, model)  # checkpoint 3's file replayed without w: the values kept
    land(5, [{"k": k, "v": 400, "w": "w5"} for k in [bucket[0][0], bucket[2][-1]]])
    evolved.checkpoint()
    assert_holds(spark, path, model, merge_schema=True)
    assert model != before_column and all(k in model for k in before_column)
    assert {tuple(pq.read_schema(f).names) for f in path.glob("part-*.parquet")} == {("k", "v", "w")}


@pytest.mark.parametrize("driver_merge_rows", [1000, 0], ids=["driver-merge", "spark-merge"])
def test_an_upsert_lacking_a_column_keeps_each_key_value_in_it_and_new_keys_null(
    spark: Any, tmp_path: Path, driver_merge_rows: int
) -> None:
    """Checkpoint 2 brings ``w`` for keys of bucket 1 only (the other buckets filled null); 3 lacks ``w``:
    an updated key of bucket 1 keeps its value, one of bucket 0 keeps null, a new key is null, a delete
    deletes; 4 lacks it again (bucket 1's footers only are read past); 5 brings ``w`` again."""
    path = tmp_path / "table"
    storage = JobStorage.for_job(str(tmp_path / "jobs"), "job")
    sink = ParquetTableSink(
        "out", Source("src"), str(path), "upsert", ["k"], buckets=BUCKETS, driver_merge_rows=driver_merge_rows,
        delete_when="gone", schema_evolution="additive",
    )  # fmt: skip
    keys = [f"k{i:02d}" for i in range(24)]
    bucket = buckets_of(spark, keys)
    checkpoints: list[tuple[str, list[tuple[Any, ...]]]] = [
        ("k string, v long, gone boolean", [(k, i, False) for i, k in enumerate(keys)]),
        ("k string, v long, w string, gone boolean", [(k, 200, f"w2-{k}", False) for k in bucket[1][:-1]]),
        ("v long, gone boolean, k string", [(300, False, k) for k in [*bucket[1][:2], bucket[0][0], "new"]]
         + [(0, True, bucket[1][2])]),
        ("k string, v long, gone boolean", [(k, 400, False) for k in [bucket[1][-1], bucket[1][3], "new"]]),
        ("k string, v long, w string, gone boolean", [(bucket[1][0], 500, "w5", False)]),
    ]  # fmt: skip
    model: Model = {}
    for checkpoint_id, (schema, rows) in enumerate(checkpoints, start=1):
        staged_and_committed(spark, sink, storage, checkpoint_id, rows, schema)
        for row in (dict(zip([c.split()[0] for c in schema.split(", ")], r, strict=True)) for r in rows):
            if row["gone"]:
                model.pop(row["k"], None)
            else:  # without w: the key's value in the table, null for a new key (Delta's MERGE with evolution)
                model[row["k"]] = (row["v"], row["w"] if "w" in row else model.get(row["k"], (None, None))[1])
        assert_holds(spark, path, model, merge_schema=checkpoint_id == len(checkpoints))
    assert model[bucket[1][0]] == (500, "w5") and model[bucket[1][1]] == (300, f"w2-{bucket[1][1]}")
    assert {tuple(pq.read_schema(f).names) for f in path.glob("part-*.parquet")} == {("k", "v", "w")}
