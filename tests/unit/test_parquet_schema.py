"""The columns of a Parquet table (connectors/files/parquet_schema.py): the input checked against the newest file's
footer (an added column passes only with ``schema_evolution="additive"``; a retype, widening included, and a missing
column never), and the bucket files filled with added columns, null, compared with pyarrow's own reading."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql.types import (
    BooleanType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from airflow_provider_checkpoint.connectors.files.parquet_schema import (
    added_fields,
    check_columns,
    filled_buckets,
    filled_files,
)
from airflow_provider_checkpoint.exceptions import SinkSchemaError

TYPES: dict[str, DataType] = {
    "INT": IntegerType(),
    "BIGINT": LongType(),
    "STRING": StringType(),
    "TIMESTAMP": TimestampType(),
    "BOOLEAN": BooleanType(),
}


def ddl(text: str) -> StructType:
    """``"a INT, b STRING"`` as a Spark schema (no session needed, unlike ``StructType.fromDDL``)."""
    return StructType([StructField(n, TYPES[t]) for n, t in (c.split() for c in text.split(", "))])


FOOTER = pa.schema([("id", pa.int32()), ("n", pa.int32()), ("at", pa.timestamp("us"))])


@pytest.mark.parametrize("additive", [False, True])
def test_the_table_own_columns_pass_and_a_timestamp_is_an_instant_either_way(additive: bool) -> None:
    check_columns("t", FOOTER, ddl("id INT, n INT, at TIMESTAMP, deleted BOOLEAN"), "deleted", additive)


def test_an_added_column_passes_only_with_additive() -> None:
    given = ddl("id INT, n INT, at TIMESTAMP, note STRING")
    check_columns("t", FOOTER, given, None, True)
    with pytest.raises(SinkSchemaError, match=r"^t: .*added column\(s\) \['note'\] \(schema_evolution='additive'"):
        check_columns("t", FOOTER, given, None, False)


@pytest.mark.parametrize("additive", [False, True])
def test_a_widened_column_is_refused_naming_both_types(additive: bool) -> None:
    wide = ddl("id INT, n BIGINT, at TIMESTAMP")
    with pytest.raises(
        SinkSchemaError, match=r"retyped column\(s\) n \(int in the table, bigint in the input\).*mergeS"
    ):
        check_columns("t", FOOTER, wide, None, additive)


def test_a_missing_column_is_written_null_with_additive_if_nullable_and_refused_without() -> None:
    with pytest.raises(SinkSchemaError, match=r"missing column\(s\) \['at'\]"):
        check_columns("t", FOOTER, ddl("id INT, n INT"), None, False)
    missing = check_columns("t", FOOTER, ddl("n INT, id INT, note STRING"), None, True)
    assert (missing.names, list(missing.order)) == (["at"], ["id", "n", "at"])
    required = pa.schema([*FOOTER, pa.field("must", pa.int32(), nullable=False)])
    with pytest.raises(
        SinkSchemaError, match=r"^t: the input lacks column\(s\) \['must'\], which the table declares NOT NULL"
    ):
        check_columns("t", required, ddl("id INT, n INT, at TIMESTAMP"), None, True)


def test_buckets_lacking_an_added_column_are_filled_with_nulls_and_keep_their_rows(tmp_path: Path) -> None:
    fs = fsspec.filesystem("file")
    old = pa.table({"id": pa.array(range(5), pa.int32()), "v": list("abcde")})
    pq.write_table(old, tmp_path / "b0.parquet", row_group_size=2)
    pq.write_table(old.append_column("note", pa.array(["x"] * 5)), tmp_path / "b1.parquet")
    added = added_fields(
        pa.schema([("id", pa.int32()), ("v", pa.string())]),
        ddl("id INT, v STRING, note STRING, ts TIMESTAMP, gone BOOLEAN"),
        "gone",
    )
    assert added == pa.schema([("note", pa.string()), ("ts", pa.timestamp("us", tz="UTC"))])
    committed = {b: (str(tmp_path / f"b{b}.parquet"), (tmp_path / f"b{b}.parquet").stat().st_size) for b in (0, 1)}
    filled = filled_buckets(fs, str(tmp_path / "filled"), added, committed)
    assert [(f.bucket, f.rows) for f in filled] == [(0, 5), (1, 5)]
    first = pq.read_table(filled[0].path)
    assert first.schema == pa.schema([*old.schema, *added])
    assert first.select(["id", "v"]).equals(old) and first["note"].null_count == first["ts"].null_count == 5
    second = pq.read_table(filled[1].path)
    assert second.select(["id", "v", "note"]).equals(pq.read_table(committed[1][0])) and second["ts"].null_count == 5
    assert [f.size for f in filled] == [Path(f.path).stat().st_size for f in filled]


def test_a_file_with_int96_timestamps_is_filled_with_int96_ones_read_back_as_before(tmp_path: Path) -> None:
    """Spark writes INT96 timestamps: the filled copy keeps them INT96, so pyarrow reads the same type and values
    from it as from the original and from Spark's other files (a microsecond copy would not unify with them)."""
    fs = fsspec.filesystem("file")
    old = pa.table({"id": [1, 2], "at": pa.array([1_700_000_000_123_456_000, None], pa.timestamp("ns"))})
    pq.write_table(old, tmp_path / "old.parquet", use_deprecated_int96_timestamps=True)
    committed = {
        "part-c0000000001-00000.parquet": (str(tmp_path / "old.parquet"), (tmp_path / "old.parquet").stat().st_size)
    }
    filled = filled_files(fs, str(tmp_path / "filled"), pa.schema([("note", pa.string())]), committed)
    path, rows, size = filled["part-c0000000001-00000.parquet"]
    assert rows == 2 and size == Path(path).stat().st_size
    assert pq.ParquetFile(path).schema.column(1).physical_type == "INT96"
    copy = pq.read_table(path)
    assert copy.schema == pa.schema([*pq.read_schema(tmp_path / "old.parquet"), ("note", pa.string())])
    assert copy.select(["id", "at"]).equals(pq.read_table(tmp_path / "old.parquet"))
    assert copy["note"].null_count == 2
