"""One row per key in upsert sinks: the rule of :mod:`~airflow_provider_checkpoint.connectors.base.upsert_rule`,
checked against a plain-Python model over seeded random inputs, and the source order it relies on."""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_checkpoint import FileSource, ParquetTableSink
from airflow_provider_checkpoint.connectors.base.upsert_rule import UpsertRows, check_sequence_by, latest_per_key
from airflow_provider_checkpoint.dataflow import DeltaTableSink, Transform
from airflow_provider_checkpoint.dataflow.driver_rows import SourceRows
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError, SinkSchemaError
from airflow_provider_checkpoint.testing.inprocess import make_job
from tests.spark.helpers import table, write_json
from tests.spark.test_delta_sink import _delta_rs, _duckdb

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SCHEMA = "k1 STRING, k2 LONG, seq LONG, v STRING"
KEY_PARTS = [None, "", "a", "ü", "a b"]


def _rows(rng: random.Random, n: int) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    for i in range(n):
        if rows and rng.random() < 0.15:  # an exact duplicate of an earlier row
            rows.append(rng.choice(rows))
            continue
        key = (rng.choice(KEY_PARTS), rng.choice([None, 0, 1, 2]))
        rows.append((*key, rng.choice([None, 1, 2, 3]), f"v{i}"))
    return rows


def _model(rows: list[tuple[Any, ...]], sequence_by: bool, key_columns: int = 2) -> set[tuple[Any, ...]]:
    """The documented rule in plain Python: per key (the first ``key_columns`` values) the greatest
    ``seq`` (the next value; a null lowest), ties → the later row."""
    best: dict[tuple[Any, ...], tuple[tuple[Any, ...], tuple[Any, ...]]] = {}
    for position, row in enumerate(rows):
        key, seq = row[:key_columns], row[key_columns]
        rank = ((seq is not None, seq or 0) if sequence_by else (False, 0), position)
        if key not in best or rank > best[key][0]:
            best[key] = (rank, row)
    return {row for _, row in best.values()}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("sequence_by", [False, True])
@pytest.mark.parametrize("where", ["spark", "driver", "source"])
def test_latest_per_key_matches_the_model(spark: SparkSession, seed: int, sequence_by: bool, where: str) -> None:
    """``source``: the rows as a source read them on the driver, reduced and bucketed there without Spark."""
    from pyspark.sql import functions as F

    rows = _rows(random.Random(seed), 300)
    df = spark.createDataFrame(rows, SCHEMA)  # several partitions, in list order
    read = SourceRows(df.toArrow(), df.schema, lambda: df) if where == "source" else None
    sequence = ["seq"] if sequence_by else []
    upsert = UpsertRows("sink", None if read else df, ["k1", "k2"], sequence, reduce=True, read=read)
    if where == "spark":
        got = [tuple(r) for r in upsert.frame().collect()]
    else:
        collected = upsert.collect(len(rows), ("b", 7))
        assert collected is not None and collected.column_names == [*df.columns, "b"]
        if where == "source":
            assert upsert._from_source(("b", 7)) is not None, "read from the source's rows"
            assert upsert.collect(1, ("b", 7)) is not None, "a source's rows whatever their number"
        buckets = spark.createDataFrame(collected.drop_columns(["b"])).select(F.pmod(F.xxhash64("k1", "k2"), F.lit(7)))
        assert collected["b"].to_pylist() == [r[0] for r in buckets.collect()], "Spark's bucket of each row"
        got = [tuple(r.values()) for r in collected.drop_columns(["b"]).to_pylist()]
    assert len(got) == len({r[:2] for r in got}), "one row per key"
    assert set(got) == _model(rows, sequence_by)


def test_the_driver_leaves_to_spark_what_pyarrow_would_compare_differently(spark: SparkSession) -> None:
    """More rows than the limit; float keys (Spark equates -0.0 with 0.0, and every NaN); a NaN sequence
    value (Spark orders it above every value): :meth:`UpsertRows.collect` declines, :meth:`frame` decides."""
    keys = spark.createDataFrame([(0.0, 1, "a"), (-0.0, 2, "b")], "k DOUBLE, s LONG, v STRING")
    assert UpsertRows("sink", keys, ["k"], [], reduce=True).collect(1) is None
    assert UpsertRows("sink", keys, ["k"], [], reduce=True).collect(10) is None
    assert [r.v for r in UpsertRows("sink", keys, ["k"], [], reduce=True).frame().collect()] == ["b"]
    nan = spark.createDataFrame([("x", float("nan"), "a"), ("x", 1.0, "b")], "k STRING, s DOUBLE, v STRING")
    assert UpsertRows("sink", nan, ["k"], ["s"], reduce=True).collect(10) is None
    assert [r.v for r in UpsertRows("sink", nan, ["k"], ["s"], reduce=True).frame().collect()] == ["a"]
    plain = nan.where("v = 'b'").union(nan.where("v = 'b'").selectExpr("k", "0.5D AS s", "'c' AS v"))
    collected = UpsertRows("sink", plain, ["k"], ["s"], reduce=True).collect(10)
    assert collected is not None and collected.to_pylist() == [{"k": "x", "s": 1.0, "v": "b"}]


def test_sequence_by_is_checked_when_defined() -> None:
    assert check_sequence_by("s", "upsert", ["id"], None) == []
    assert check_sequence_by("s", "upsert", ["id"], "ts") == ["ts"]
    for mode, columns in [("append", ["ts"]), ("upsert", []), ("upsert", ["ts", "ts"]), ("upsert", ["id"])]:
        with pytest.raises(PipelineDefinitionError):
            check_sequence_by("s", mode, ["id"], columns)


def test_a_missing_key_or_sequence_column_is_named(spark: SparkSession) -> None:
    df = spark.createDataFrame([("a", 1)], "id STRING, v LONG")
    with pytest.raises(SinkSchemaError, match=r"\['ts'\]"):
        latest_per_key("sink", df, ["id"], ["ts"])


@pytest.mark.parametrize("fmt", ["json", "parquet"])
@pytest.mark.parametrize("scans", ["one per file", "one, sorted"])
def test_a_file_source_delivers_its_records_in_source_order(
    spark: SparkSession, tmp_path: Path, fmt: str, scans: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files by name, lines in order, whatever the file sizes (one Spark scan would put the largest first)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_provider_checkpoint.fileio import scans as file_scans

    monkeypatch.setattr(file_scans, "ORDERED_SCAN_FILES", 32 if scans == "one per file" else 1)
    spark.conf.set("spark.sql.files.maxPartitionBytes", "1024")  # a large file is split too

    landing = tmp_path / "landing"
    expected: list[int] = []
    sizes = [3, 200, 1, 50, 7]  # later files smaller and larger than earlier ones
    todo: dict[str, int] = {}
    for i, n in enumerate(sizes):
        ids = list(range(len(expected), len(expected) + n))
        expected += ids
        path = landing / f"part-{i:02d}.{fmt}"
        if fmt == "json":
            write_json(path, [{"id": x} for x in ids])
        else:
            landing.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), path, row_group_size=17)
        todo[path.name] = path.stat().st_size
    source = FileSource("events", str(landing), fmt, "id LONG")
    source.in_source_order = True  # as a pipeline with an upsert sink downstream sets it

    class Ctx:
        pass

    ctx: Any = Ctx()
    ctx.spark = spark
    df = source.load(ctx, todo)
    from pyspark.sql import functions as F

    try:
        got = [r[0] for r in df.select("id", F.monotonically_increasing_id().alias("o")).orderBy("o").collect()]
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
    assert got == expected


EVENT = "id STRING, seq LONG, v LONG"


def _declare_publishing(base: Path) -> None:
    events = FileSource("events", f"{base}/landing", "json", EVENT)
    ParquetTableSink("parquet", events, f"{base}/parquet", mode="upsert", keys=["id"], buckets=4, step="publish")
    DeltaTableSink("delta", events, f"{base}/delta", mode="upsert", keys=["id"], buckets=4, step="publish")
    DeltaTableSink(
        "delta_seq", events, f"{base}/delta_seq", mode="upsert", keys=["id"], sequence_by=["seq"], step="publish"
    )


def _expected(batches: list[list[dict[str, Any]]], by_seq: bool) -> dict[Any, tuple[Any, Any]]:
    """Per key its row: later checkpoints replace earlier ones; within one, the rule's winner."""
    table: dict[Any, tuple[Any, Any]] = {}
    for rows in batches:
        flat = [(r["id"], r["seq"], r["v"]) for r in rows]
        for row in _model(flat, by_seq, key_columns=1):
            table[row[0]] = (row[1], row[2])
    return table


def test_a_backlog_with_repeated_keys_lands_one_row_per_key_in_every_sink(spark: SparkSession, tmp_path: Path) -> None:
    """Files of one checkpoint update the same keys (also within a file, with exact duplicates):
    every upsert sink keeps the later row in source order, or the greatest ``seq``; read back
    with pyarrow, delta-rs and DuckDB."""

    job = make_job(spark, tmp_path, _declare_publishing)
    rng = random.Random(7)
    batches: list[list[dict[str, Any]]] = []
    file_no = 0
    for files in (4, 1, 3):  # a backlog, one file, a backlog again
        rows: list[dict[str, Any]] = []
        for _ in range(files):
            lines = [
                {"id": rng.choice([None, "", "a", "ü", "k1", "k2"]), "seq": rng.choice([None, 1, 2, 3]), "v": file_no}
                for _ in range(rng.choice([2, 40]))
            ]
            lines += [dict(lines[0])]  # an exact duplicate
            write_json(tmp_path / "landing" / f"{file_no:03d}.json", lines)
            rows += lines
            file_no += 1
        batches.append(rows)
        job.checkpoint()
        for name, by_seq in (("parquet", False), ("delta", False), ("delta_seq", True)):
            expected = _expected(batches, by_seq)
            readers = [table] if name == "parquet" else [_delta_rs, _duckdb]
            for read in readers:
                rows = _rows_of(read(tmp_path / name))
                assert len(rows) == len({r[0] for r in rows}), f"{name} via {read.__name__}: one row per key"
                assert {r[0]: r[1:] for r in rows} == expected, f"{name} via {read.__name__}"


def _rows_of(df: Any) -> list[tuple[Any, ...]]:
    """``(id, seq, v)`` of every row, nulls as ``None`` whatever the reader made of them."""
    import pandas as pd

    def value(x: Any) -> Any:
        return None if pd.isna(x) else x if isinstance(x, str) else int(x)

    return [tuple(value(x) for x in row) for row in df[["id", "seq", "v"]].astype(object).itertuples(index=False)]


def test_every_sink_that_refuses_its_input_is_named(spark: SparkSession, tmp_path: Path) -> None:
    def declare(base: Path) -> None:
        events = FileSource("events", f"{base}/landing", "json", EVENT)
        shaped = Transform("shaped", events, lambda df: df)  # its columns are Spark's to tell: checked at run time
        for uid in ("first", "second"):
            ParquetTableSink(uid, shaped, f"{base}/{uid}", "upsert", ["id"], sequence_by=["ts"], step="publish")

    job = make_job(spark, tmp_path, declare)
    write_json(tmp_path / "landing" / "0.json", [{"id": "a", "seq": 1, "v": 1}])
    with pytest.raises(SinkSchemaError, match=r"2 sinks refuse their input: sink first: .*; sink second: "):
        job.checkpoint()
