"""Parquet files read on the driver (:mod:`~airflow_provider_checkpoint.fileio.driver_read`) against Spark's
reader as the oracle: random files of several types (nulls, extreme values, ancient dates, timestamps of
other zones and units, decimals, binary, nested), declared schemas that match them, miss a column, name one
in another case or give another type. Wherever the driver reads, its table equals
``spark.read.schema(declared).parquet(file).toArrow()`` file by file; where the declared schema equals the
file's flat types, it reads (the fallback is not taken for granted). ``DRIVER_READ_EXAMPLES`` sets the
number of drawn cases (CI: 25)."""

from __future__ import annotations

import os
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.types import StructType

from airflow_provider_checkpoint.fileio.driver_read import expected_schema, read_exactly

pytestmark = pytest.mark.spark

EXAMPLES = int(os.environ.get("DRIVER_READ_EXAMPLES", "25"))

Columns = dict[str, tuple[pa.DataType, str, st.SearchStrategy]]
# name → (Arrow type written, Spark DDL type it matches, values drawn)
COLUMNS: Columns = {
    "i": (pa.int32(), "INT", st.integers(-(2**31), 2**31 - 1)),
    "l": (pa.int64(), "BIGINT", st.integers(-(2**63), 2**63 - 1)),
    "s": (pa.string(), "STRING", st.text(max_size=12)),
    "d": (pa.float64(), "DOUBLE", st.floats(allow_nan=True, allow_infinity=True)),
    "b": (pa.bool_(), "BOOLEAN", st.booleans()),
    "day": (pa.date32(), "DATE", st.dates(date(1000, 1, 1), date(9999, 12, 31))),
    "t": (
        pa.timestamp("us", tz="UTC"),
        "TIMESTAMP",
        st.datetimes(datetime(1800, 1, 1), datetime(2200, 1, 1), timezones=st.just(UTC)),
    ),
    "ntz": (pa.timestamp("us"), "TIMESTAMP_NTZ", st.datetimes(datetime(1950, 1, 1), datetime(2100, 1, 1))),
    "dec": (pa.decimal128(10, 2), "DECIMAL(10,2)", st.decimals("-99999999.99", "99999999.99", places=2)),
    "bin": (pa.binary(), "BINARY", st.binary(max_size=8)),
    "ms": (pa.timestamp("ms", tz="UTC"), "TIMESTAMP", st.datetimes(datetime(1970, 1, 1), datetime(2100, 1, 1))),
    "paris": (
        pa.timestamp("us", tz="Europe/Paris"),
        "TIMESTAMP",
        st.datetimes(datetime(1950, 1, 1), datetime(2100, 1, 1), timezones=st.just(UTC)),
    ),
    "small": (pa.int16(), "SMALLINT", st.integers(-(2**15), 2**15 - 1)),
    "arr": (pa.list_(pa.int32()), "ARRAY<INT>", st.lists(st.integers(-5, 5), max_size=3)),
}
OTHER_TYPE = {"INT": "BIGINT", "BIGINT": "INT", "STRING": "BINARY", "DOUBLE": "FLOAT", "DATE": "TIMESTAMP"}


def drawn_files(draw: st.DrawFn, columns: Columns, names: list[str], most: int, rows: int) -> list[pa.Table]:
    """1 to ``most`` tables of the ``names`` of ``columns``, each of up to ``rows`` drawn rows (nulls among them)."""
    files = []
    for _ in range(draw(st.integers(1, most))):
        n = draw(st.integers(0, rows))
        arrays = []
        for name in names:
            arrow, _, values = columns[name]
            drawn = draw(st.lists(st.none() | values, min_size=n, max_size=n))
            if name == "dec":
                drawn = [None if v is None else Decimal(v) for v in drawn]
            arrays.append(pa.array(drawn, arrow))
        files.append(pa.table(arrays, names=names))
    return files


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[pa.Table], str, bool]:
    """Files of the drawn columns, a declared schema, and whether it matches the files exactly."""
    names = draw(st.lists(st.sampled_from(sorted(COLUMNS)), min_size=1, max_size=5, unique=True))
    files = drawn_files(draw, COLUMNS, names, 3, 6)
    declared = {name: COLUMNS[name][1] for name in names}
    exact = True
    change = draw(st.sampled_from(["none", "missing", "case", "type"]))
    if change == "missing":
        declared["extra"] = "STRING"
    elif change == "case":
        name = draw(st.sampled_from(names))
        declared = {(n.upper() if n == name else n): t for n, t in declared.items()}
        exact = False
    elif change == "type":
        name = draw(st.sampled_from(names))
        declared[name] = OTHER_TYPE.get(declared[name], "STRING")
        exact = False
    ddl = ", ".join(f"`{n}` {t}" for n, t in declared.items())
    return files, ddl, exact


def _spark_rows(spark, paths: list[str], ddl: str) -> pa.Table | None:
    """Spark's rows of each file in turn, or ``None`` if Spark refuses to read one."""
    tables = []
    for path in paths:
        try:
            tables.append(spark.read.schema(ddl).parquet(path).toArrow())
        except Exception:  # Spark refuses (a type it cannot read as declared, a rebase): any answer differs
            return None
    return pa.concat_tables(tables)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_driver_read_equals_sparks(spark, tmp_path_factory: pytest.TempPathFactory, case) -> None:
    files, ddl, exact = case
    base = tmp_path_factory.mktemp("files")
    paths = []
    for i, table in enumerate(files):
        paths.append(f"{base}/part-{i}.parquet")
        pq.write_table(table, paths[-1])
    declared = StructType.fromDDL(ddl)
    assert isinstance(declared, StructType)
    sizes = [Path(p).stat().st_size for p in paths]
    ours = read_exactly(fsspec.filesystem("file"), paths, sizes, expected_schema(declared))
    if ours is not None:
        theirs = _spark_rows(spark, paths, ddl)
        assert theirs is not None, f"Spark refuses what the driver read: {ddl}"
        assert ours.schema == theirs.schema, (ours.schema, theirs.schema)
        assert ours.equals(theirs), (ddl, ours.to_pylist(), theirs.to_pylist())
    names = files[0].column_names
    flat = exact and not {"ms", "paris", "arr"} & set(names)
    old = [f for f in files for n in ("day", "t") if n in names and _has_ancient(f[n])]
    if flat and not old:
        assert ours is not None, f"the driver fell back on files of exactly the declared types: {ddl}"


def _has_ancient(column: pa.ChunkedArray) -> bool:
    limit = date(1582, 10, 15) if pa.types.is_date32(column.type) else datetime(1900, 1, 1, tzinfo=UTC)
    return any(v is not None and v < limit for v in column.to_pylist())


def test_a_corrupt_file_is_left_to_spark(spark, tmp_path: Path) -> None:
    path = tmp_path / "part-0.parquet"
    pq.write_table(pa.table({"i": pa.array([1, 2], pa.int32())}), path, write_page_checksum=True)
    data = path.read_bytes()
    path.write_bytes(data[:10] + b"\xff" * 8 + data[18:])  # a damaged page
    declared = StructType.fromDDL("i INT")
    assert isinstance(declared, StructType)
    fs = fsspec.filesystem("file")
    assert read_exactly(fs, [str(path)], [len(data)], expected_schema(declared)) is None


def test_a_negative_driver_read_bound_is_refused(spark, tmp_path: Path) -> None:
    from airflow_provider_checkpoint.dataflow import FileSource
    from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

    with pytest.raises(PipelineDefinitionError, match="driver_read_bytes"):
        FileSource("s", str(tmp_path), "parquet", "i INT", driver_read_bytes=-1)
    assert FileSource("s", str(tmp_path), "parquet", "i INT", driver_read_bytes=0).driver_read_bytes == 0
