"""One row per key in upsert sinks: the rule of :mod:`~airflow_provider_checkpoint.dataflow.sinks.upsert_rule`,
checked against a plain-Python model over seeded random inputs, and the source order it relies on."""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_checkpoint import FileSource
from airflow_provider_checkpoint.dataflow.sinks.upsert_rule import check_sequence_by, latest_per_key
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError, SinkSchemaError
from tests.spark.helpers import write_json

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


def _model(rows: list[tuple[Any, ...]], sequence_by: bool) -> set[tuple[Any, ...]]:
    """The documented rule in plain Python: per key the greatest ``seq`` (a null lowest), ties → the later row."""
    best: dict[tuple[Any, ...], tuple[tuple[Any, ...], tuple[Any, ...]]] = {}
    for position, row in enumerate(rows):
        seq = row[2]
        rank = ((seq is not None, seq or 0) if sequence_by else (False, 0), position)
        if row[:2] not in best or rank > best[row[:2]][0]:
            best[row[:2]] = (rank, row)
    return {row for _, row in best.values()}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("sequence_by", [False, True])
def test_latest_per_key_matches_the_model(spark: SparkSession, seed: int, sequence_by: bool) -> None:
    rows = _rows(random.Random(seed), 300)
    df = spark.createDataFrame(rows, SCHEMA)  # several partitions, in list order
    out = latest_per_key("sink", df, ["k1", "k2"], ["seq"] if sequence_by else [])
    got = [tuple(r) for r in out.collect()]
    assert len(got) == len({r[:2] for r in got}), "one row per key"
    assert set(got) == _model(rows, sequence_by)


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
def test_a_file_source_delivers_its_records_in_source_order(spark: SparkSession, tmp_path: Path, fmt: str) -> None:
    """Files by name, lines in order, whatever the file sizes (one Spark scan would put the largest first)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

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

    class Ctx:
        pass

    ctx: Any = Ctx()
    ctx.spark = spark
    df = source.load(ctx, todo)
    from pyspark.sql import functions as F

    got = [r[0] for r in df.select("id", F.monotonically_increasing_id().alias("o")).orderBy("o").collect()]
    assert got == expected
