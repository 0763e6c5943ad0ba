"""The Python file engine's reads give the same rows on the driver (small files, sizes known) and on the
executors (``mapInArrow``), checked against rows parsed independently (``json``, pyarrow)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from airflow_provider_checkpoint.fileio import scans

pytestmark = pytest.mark.spark

DECLARED = StructType([StructField("user", StringType()), StructField("ts", LongType())])


def plan_of(df: Any) -> str:
    return str(df._jdf.queryExecution().optimizedPlan().toString())


def json_files(root: Path, seed: int) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Files of JSON lines (unicode, nulls, missing fields, malformed lines, an empty file) and the rows
    a permissive read gives: ``(user, ts, corrupt text)``, parsed here with ``json``."""
    rng = random.Random(seed)
    paths, expected = [], []
    for f in range(4):
        lines = []
        for _ in range(rng.randrange(0 if f == 2 else 1, 30)):
            if rng.random() < 0.1:
                lines.append('{"user": "broken", "ts": ')
                expected.append((None, None, lines[-1]))
                continue
            record = {"user": rng.choice([None, "", "a", "é✓𝄞"]), "ts": rng.choice([None, rng.randrange(-9, 10**12)])}
            record = {k: v for k, v in record.items() if rng.random() < 0.9}
            lines.append(json.dumps(record, ensure_ascii=rng.random() < 0.5))
            expected.append((record.get("user"), record.get("ts"), None))
        path = root / f"events-{f}.json"
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        paths.append(str(path))
    return paths, expected


@pytest.mark.parametrize("seed", [1, 2])
def test_json_lines_read_alike_on_the_driver_and_on_the_executors(spark, tmp_path, monkeypatch, seed) -> None:
    fs = fsspec.filesystem("file")
    paths, expected = json_files(tmp_path, seed)
    sizes = [Path(p).stat().st_size for p in paths]
    rows = {}
    for where, limit in (("driver", scans.DRIVER_READ_BYTES), ("executors", 0)):
        monkeypatch.setattr(scans, "DRIVER_READ_BYTES", limit)
        df = scans.read_records(spark, fs, paths, "json", DECLARED, {}, "_corrupt", engine="python", sizes=sizes)
        assert ("MapInArrow" in plan_of(df)) is (where == "executors"), plan_of(df)
        rows[where] = [(r["user"], r["ts"], r["_corrupt"]) for r in df.collect()]
    assert rows["driver"] == rows["executors"] == expected  # in file order, each file's lines in order


def test_parquet_reads_alike_with_file_column_and_row_index(spark, tmp_path, monkeypatch) -> None:
    fs = fsspec.filesystem("file")
    rng = random.Random(7)
    paths, expected = [], []
    for f in range(3):
        users = [rng.choice([None, "", "b", "ü𝄞"]) for _ in range(rng.randrange(0, 40))]
        table = pa.table({"user": pa.array(users, pa.string()), "ts": pa.array(range(len(users)), pa.int64())})
        path = str(tmp_path / f"part-{f}.parquet")
        pq.write_table(table, path)
        paths.append(path)
        expected += [(u, i, i, Path(path).name) for i, u in enumerate(users)]
    sizes = [Path(p).stat().st_size for p in paths]
    column = scans.FileColumn("_file", "name")
    rows = {}
    for where, limit in (("driver", scans.DRIVER_READ_BYTES), ("executors", 0)):
        monkeypatch.setattr(scans, "DRIVER_READ_BYTES", limit)
        df = scans.read_parquet(spark, fs, paths, DECLARED, column, "python", row_index="_row", sizes=sizes)
        assert ("MapInArrow" in plan_of(df)) is (where == "executors"), plan_of(df)
        rows[where] = [(r["user"], r["ts"], r["_row"], r["_file"]) for r in df.collect()]
    assert rows["driver"] == rows["executors"] == expected


def test_a_read_of_unknown_sizes_runs_on_the_executors(spark, tmp_path) -> None:
    paths, expected = json_files(tmp_path, 3)
    df = scans.read_records(spark, fsspec.filesystem("file"), paths, "json", DECLARED, {}, "_c", engine="python")
    assert "MapInArrow" in plan_of(df)
    assert [(r["user"], r["ts"], r["_c"]) for r in df.collect()] == expected


def test_parquet_column_names_resolve_as_sparks_reader_resolves_them(spark, tmp_path, monkeypatch) -> None:
    """Spark's Parquet reader matches a declared column to the file's column of another case (the session is
    case-insensitive); the Python engine gives the same rows, and refuses a name two file columns fold to,
    as Spark does."""
    fs = fsspec.filesystem("file")
    path = str(tmp_path / "cased.parquet")
    pq.write_table(pa.table({"User": ["a", None, "é"], "TS": pa.array([1, 2, None], pa.int64())}), path)
    hadoop = [tuple(r) for r in scans.read_parquet(spark, fs, [path], DECLARED, engine="hadoop").collect()]
    assert hadoop == [("a", 1), (None, 2), ("é", None)]
    for limit in (scans.DRIVER_READ_BYTES, 0):  # on the driver, on the executors
        monkeypatch.setattr(scans, "DRIVER_READ_BYTES", limit)
        df = scans.read_parquet(spark, fs, [path], DECLARED, engine="python", sizes=[Path(path).stat().st_size])
        assert [tuple(r) for r in df.collect()] == hadoop
    twice = str(tmp_path / "twice.parquet")
    pq.write_table(pa.table({"user": ["a"], "USER": ["b"], "ts": [1]}), twice)
    with pytest.raises(Exception, match=r"(?i)duplicate field"):
        scans.read_parquet(spark, fs, [twice], DECLARED, engine="hadoop").collect()
    with pytest.raises(Exception, match=r"(?i)duplicate field"):
        scans.read_parquet(spark, fs, [twice], DECLARED, engine="python", sizes=[Path(twice).stat().st_size]).collect()


ORACLE_SCHEMA = "day DATE, d DOUBLE, t TIMESTAMP, s STRING"
ORACLE_LINES = {
    "json": [
        *(f'{{"day": "{v}"}}' for v in ("2020-1-2", "2020-01-02T10:00:00", "2020-01-02 x", "2020-01-02x", "2020")),
        *(f'{{"day": "{v}"}}' for v in ("2020-01", " 2020-01-02 ", "+2020-01-02", "2020-02-30", "2020-W01-1")),
        *(f'{{"d": "{v}"}}' for v in ("NaN", "Infinity", "+Infinity", "-Infinity", "+INF", "-INF", "INF", "nan")),
        '{"t": -1}', '{"t": 1577934245}', '{"t": 1.5}', '{"t": "2020-01-02T03:04:05+02:00"}', '{"s": 12}',
        '{"d": "x", "s": "kept"}', '{"day": [1], "d": 2}', "[1, 2]",
    ],
    "csv": ["day,d,t,s", "2020-1-2,,,", "2020-01-02T10:00:00,,,", "20200102,,,", "2020-W01-1,,,", ",NaN,,",
            ",-Infinity,,", "2020-01-02,x,,s", "2020-01-02,1", "2020-01-02,1,,s,extra", ",", '"a,b"'],
}  # fmt: skip


@pytest.mark.parametrize("format", ["json", "csv"])
def test_records_parse_as_sparks_permissive_readers_parse_them(spark, tmp_path, format) -> None:
    """Values Python's parsers take otherwise than Spark's readers (lenient dates, non-numeric floats in JSON
    strings, JSON numbers as epoch seconds, a malformed record's fields that convert, which Spark keeps):
    the Python engine's rows equal Spark's, line by line."""
    path = tmp_path / f"oracle.{format}"
    path.write_text("".join(line + "\n" for line in ORACLE_LINES[format]), encoding="utf-8")
    declared = StructType.fromDDL(ORACLE_SCHEMA)
    assert isinstance(declared, StructType)
    fs, size = fsspec.filesystem("file"), [path.stat().st_size]
    rows = {}
    for engine in ("hadoop", "python"):
        df = scans.read_records(spark, fs, [str(path)], format, declared, {}, "_c", engine=engine, sizes=size)
        rows[engine] = [repr(tuple(r)) for r in df.collect()]  # repr: NaN equals NaN
    assert rows["python"] == rows["hadoop"]
