"""The Python file engine reads Parquet files into a declared schema with exactly Spark's values, or refuses
with an error naming the file and the column: random files (the columns of
``test_parquet_driver_read``, plus unsigned integers, nanoseconds, INT96, structs with fields in another
case) declared with random types, read by Spark's reader (the oracle) and by ours, compared row by row.
``PYTHON_PARQUET_EXAMPLES`` sets the number of drawn cases (CI: 25)."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.types import StructType

from airflow_provider_checkpoint.fileio import scans
from airflow_provider_checkpoint.fileio.parquet_types import ParquetTypeError
from tests.spark.test_parquet_driver_read import COLUMNS as DRIVER_READ_COLUMNS
from tests.spark.test_parquet_driver_read import drawn_files

pytestmark = pytest.mark.spark

EXAMPLES = int(os.environ.get("PYTHON_PARQUET_EXAMPLES", "25"))

COLUMNS = {
    **DRIVER_READ_COLUMNS,
    "u8": (pa.uint8(), "SMALLINT", st.integers(0, 255)),
    "u32": (pa.uint32(), "BIGINT", st.integers(0, 2**32 - 1)),
    "ns": (pa.timestamp("ns"), "BIGINT", st.integers(-(2**62), 2**62)),
    "f": (pa.float32(), "FLOAT", st.floats(width=32)),
    "st": (
        pa.struct([("A", pa.int32()), ("b", pa.string())]),
        "STRUCT<a: INT, b: STRING>",
        st.fixed_dictionaries({"A": st.none() | st.integers(-9, 9), "b": st.none() | st.text(max_size=3)}),
    ),
}
DECLARABLE = [
    "BOOLEAN", "TINYINT", "SMALLINT", "INT", "BIGINT", "FLOAT", "DOUBLE", "DECIMAL(10,2)", "DECIMAL(12,4)",
    "DECIMAL(20,0)", "STRING", "BINARY", "DATE", "TIMESTAMP", "TIMESTAMP_NTZ", "ARRAY<BIGINT>",
    "STRUCT<A: BIGINT, c: STRING>",
]  # fmt: skip


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[pa.Table], str, bool]:
    """Files of the drawn columns, a declared schema (each column its own type or another), INT96 or not."""
    names = draw(st.lists(st.sampled_from(sorted(COLUMNS)), min_size=1, max_size=4, unique=True))
    files = drawn_files(draw, COLUMNS, names, 2, 5)
    declared = {n: draw(st.sampled_from([COLUMNS[n][1], *DECLARABLE])) for n in names}
    ddl = ", ".join(f"`{n.upper() if draw(st.booleans()) else n}` {t}" for n, t in declared.items())
    return files, ddl, draw(st.booleans())


def _rows(table: pa.Table) -> tuple[str, list[str]]:
    """The schema and the rows (repr: NaN equals NaN), in any order: Spark's scan orders files by size."""
    return str(table.schema), sorted(repr(r) for r in table.to_pylist())


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_python_engine_reads_sparks_values_or_refuses(spark, tmp_path_factory: pytest.TempPathFactory, case) -> None:
    files, ddl, int96 = case
    base = tmp_path_factory.mktemp("files")
    paths = [f"{base}/part-{i}.parquet" for i in range(len(files))]
    for table, path in zip(files, paths, strict=True):
        pq.write_table(table, path, use_deprecated_int96_timestamps=int96)
    declared = StructType.fromDDL(ddl)
    assert isinstance(declared, StructType)
    fs = fsspec.filesystem("file")
    try:
        theirs: pa.Table | None = scans.read_parquet(spark, fs, paths, declared, engine="hadoop").toArrow()
    except Exception:  # Spark refuses: so must we
        theirs = None
    sizes = [Path(p).stat().st_size for p in paths]
    try:
        ours = scans.read_parquet(spark, fs, paths, declared, engine="python", sizes=sizes).toArrow()
    except ParquetTypeError as e:
        assert "Parquet file file://" in str(e) and "column " in str(e), e
        return
    assert theirs is not None, f"Spark refuses what the Python engine read: {ddl}, {ours.to_pylist()}"
    assert _rows(ours) == _rows(theirs), ddl


def test_a_refusal_names_the_file_the_column_and_both_types(spark, tmp_path: Path) -> None:
    path = str(tmp_path / "wide.parquet")
    pq.write_table(pa.table({"n": pa.array([2**40], pa.int64())}), path)
    declared = StructType.fromDDL("n INT")
    assert isinstance(declared, StructType)
    fs = fsspec.filesystem("file")
    with pytest.raises(Exception, match="(?i)Parquet column cannot be converted|CONVERT"):
        scans.read_parquet(spark, fs, [path], declared, engine="hadoop").collect()
    with pytest.raises(ParquetTypeError, match=rf"Parquet file file://{path}: column 'n' is int64 .* declared int32"):
        scans.read_parquet(spark, fs, [path], declared, engine="python", sizes=[Path(path).stat().st_size])


def test_int96_and_nested_fields_of_another_case_read_as_spark_reads_them(spark, tmp_path: Path) -> None:
    path = str(tmp_path / "old.parquet")
    stamps = pa.array([-6 * 10**18 - 1, 1577934245123456789, None], pa.timestamp("ns"))  # rounded down to us
    nested = pa.array([{"A": 1}, None, {"A": None}], pa.struct([("A", pa.int32())]))
    pq.write_table(pa.table({"t": stamps, "s": nested}), path, use_deprecated_int96_timestamps=True)
    declared = StructType.fromDDL("t TIMESTAMP, s STRUCT<a: BIGINT, z: STRING>")
    assert isinstance(declared, StructType)
    fs = fsspec.filesystem("file")
    theirs = scans.read_parquet(spark, fs, [path], declared, engine="hadoop").toArrow()
    ours = scans.read_parquet(spark, fs, [path], declared, engine="python", sizes=[Path(path).stat().st_size])
    assert _rows(ours.toArrow()) == _rows(theirs)
    assert theirs.column("t")[0].as_py() == datetime(1779, 11, 13, 13, 19, 59, 999999, tzinfo=UTC)
    assert theirs.column("s").to_pylist() == [{"a": 1, "z": None}, None, {"a": None, "z": None}]
