"""The pure parts of the Spark file I/O layer: record parsing, partition directories, files a task writes."""

from __future__ import annotations

import datetime as dt
import decimal
import json
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_checkpoint.exceptions import PipelineDefinitionError
from airflow_provider_checkpoint.fileio import file_readers
from airflow_provider_checkpoint.fileio import records as text_records
from airflow_provider_checkpoint.fileio import scans as file_scans
from airflow_provider_checkpoint.fileio import writes as file_io
from airflow_provider_checkpoint.storage.job_storage import file_checksum
from airflow_provider_checkpoint.storage.object_store import for_executors

SCHEMA = pa.schema(
    [
        ("id", pa.int32()),
        ("name", pa.string()),
        ("price", pa.float64()),
        ("ok", pa.bool_()),
        ("amount", pa.decimal128(6, 2)),
        ("day", pa.date32()),
        ("at", pa.timestamp("us", tz="UTC")),
    ]
)


def parsed(lines: list[str], format: str, options: dict[str, str] | None = None) -> list[tuple[object, str]]:
    return list(text_records.records(lines, format, SCHEMA, options or {}))


def test_json_lines_convert_by_column_and_malformed_records_keep_their_text() -> None:
    good = {
        "id": 1,
        "name": "a",
        "price": 2,
        "ok": True,
        "amount": 1.5,
        "day": "2026-01-02",
        "at": "2026-01-02T03:04:05",
    }
    lines = [
        json.dumps(good) + "\n",
        "\n",
        '{"id": 2, "extra": 1}\n',
        '{"id": "3"}\n',
        '{"id": 2147483648}\n',
        '{"ok": 1}\n',
        "[1, 2]\n",
        "not json\n",
        '{"name": 7}',
    ]
    got = parsed(lines, "json")
    assert got[0] == (
        [
            1,
            "a",
            2.0,
            True,
            decimal.Decimal("1.50"),
            dt.date(2026, 1, 2),
            dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        ],
        json.dumps(good),
    )
    assert got[1] == ([2, None, None, None, None, None, None], '{"id": 2, "extra": 1}')
    assert [raw for values, raw in got if values is None] == ["[1, 2]", "not json"]  # not an object: all null
    partly = [raw for values, raw in got if isinstance(values, text_records.PartlyMalformed)]
    assert partly == ['{"id": "3"}', '{"id": 2147483648}', '{"ok": 1}']  # a value that does not convert
    assert got[-1][0] == [None, "7", None, None, None, None, None]  # a string column takes any JSON value's text


def test_csv_skips_the_header_and_blank_lines_and_marks_wrong_field_counts_and_types_malformed() -> None:
    lines = [
        "id,name,price,ok,amount,day,at\n",
        '1,"a,b",2.5,TRUE,3,2026-01-02,2026-01-02 03:04:05\n',
        "\n",
        "2,,,,,,\n",
        "3,x\n",
        "x,a,1,true,1,2026-01-02,2026-01-02\n",
        "4,a,1,yes,1,2026-01-02,2026-01-02\n",
        "5,a,1,true,12345.678,2026-01-02,2026-01-02\n",
    ]
    got = parsed(lines, "csv")
    assert got[0][0] == [
        1,
        "a,b",
        2.5,
        True,
        decimal.Decimal("3.00"),
        dt.date(2026, 1, 2),
        dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
    ]
    assert got[1][0] == [2, None, None, None, None, None, None]  # an empty field is null
    malformed = [(values, raw) for values, raw in got if isinstance(values, text_records.PartlyMalformed)]
    assert [raw for _, raw in malformed] == [line.strip() for line in lines[4:]]
    day, at = dt.date(2026, 1, 2), dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    assert [list(values) for values, _ in malformed] == [  # the fields that convert kept, as Spark keeps them
        [3, "x", None, None, None, None, None],
        [None, "a", 1.0, True, decimal.Decimal("1.00"), day, at],
        [4, "a", 1.0, None, decimal.Decimal("1.00"), day, at],
        [5, "a", 1.0, True, None, day, at],
    ]
    assert len(got) == 6


def test_csv_honours_separator_and_no_header() -> None:
    got = parsed(["1;a;;;;;\n"], "csv", {"sep": ";", "header": "false"})
    assert got == [([1, "a", None, None, None, None, None], "1;a;;;;;")]


@pytest.mark.parametrize(("format", "options"), [("json", {"multiLine": "true"}), ("csv", {"inferSchema": "true"})])
def test_options_the_python_reader_would_not_honour_are_refused(format: str, options: dict[str, str]) -> None:
    with pytest.raises(PipelineDefinitionError, match="Hadoop filesystem"):
        text_records.check_options(format, options)


def test_complex_column_types_are_refused_up_front() -> None:
    with pytest.raises(PipelineDefinitionError, match="'tags'"):
        text_records.converters(pa.schema([("tags", pa.list_(pa.string()))]), text=False)


def test_split_by_writes_one_group_per_value_with_spark_directory_names() -> None:
    table = pa.table({"k": [1, 2, None, 1], "p": ["a/b", "x", "x", "a/b"], "v": [10, 20, 30, 40]})
    groups = {within: part.to_pydict() for within, part in file_io.split_by(table, ["k", "p"])}
    assert groups == {
        "k=1/p=a%2Fb": {"v": [10, 40]},
        "k=2/p=x": {"v": [20]},
        "k=__HIVE_DEFAULT_PARTITION__/p=x": {"v": [30]},
    }
    assert [file_io.partition_values(w) for w in groups] == [("1", "a/b"), ("2", "x"), (None, "x")]
    assert list(file_io.split_by(table, [])) == [("", table)]
    ((within, one),) = file_io.split_by(table.slice(1, 2), ["p"])  # one value: all rows, no copy
    assert (within, one.to_pydict()) == ("p=x", {"k": [2, None], "v": [20, 30]})
    assert list(file_io.split_by(table.slice(0, 0), ["k"])) == []


def test_a_part_file_reports_the_size_rows_and_checksum_of_what_it_wrote(tmp_path: Path) -> None:
    fs = fsspec.filesystem("file")
    part = file_io._PartFile(fs, f"{tmp_path}/k=1/part-0.parquet", "zstd")
    for start in range(0, 30, 10):
        part.add(pa.table({"v": list(range(start, start + 10))}))
    path, size, rows, checksum = part.close()
    assert (size, rows, checksum) == (Path(path).stat().st_size, 30, file_checksum(fs, path))
    assert pq.read_table(path).column("v").to_pylist() == list(range(30))


def test_written_by_spark_lists_data_files_with_their_partitions(tmp_path: Path) -> None:
    (tmp_path / "kgr=3").mkdir()
    pq.write_table(pa.table({"v": [1, 2]}), tmp_path / "kgr=3" / "part-00000-x.c000.snappy.parquet")
    (tmp_path / "kgr=3" / ".part-00000-x.crc").write_bytes(b"")
    (tmp_path / "_SUCCESS").write_bytes(b"")
    fs = fsspec.filesystem("file")
    (written,) = file_io.written_by_spark(fs, str(tmp_path))
    assert (written.partition, written.rows, written.row_count(fs)) == (("3",), None, 2)
    assert written.sha256(fs) == file_checksum(fs, written.path)


def test_parquet_reader_conforms_files_to_the_schema(tmp_path: Path) -> None:
    pq.write_table(pa.table({"b": [1, 2], "a": ["x", "y"]}), tmp_path / "f.parquet")
    schema = pa.schema([("a", pa.string()), ("b", pa.int64()), ("c", pa.float64())])
    reader = file_readers.ParquetReader(fsspec.filesystem("file"), schema)
    (batch,) = list(reader(str(tmp_path / "f.parquet")))
    assert batch.schema == schema
    assert batch.to_pydict() == {"a": ["x", "y"], "b": [1, 2], "c": [None, None]}


def test_record_reader_yields_the_corrupt_column(tmp_path: Path) -> None:
    (tmp_path / "f.json").write_text('{"a": 1}\nbad\n')
    schema = pa.schema([("a", pa.int32()), ("_corrupt_record", pa.string())])
    reader = file_readers.RecordReader(fsspec.filesystem("file"), "json", schema, {})
    (batch,) = list(reader(str(tmp_path / "f.json")))
    assert batch.to_pydict() == {"a": [1, None], "_corrupt_record": [None, "bad"]}


def test_record_reader_refuses_a_read_short_of_the_size_cut_into_the_barrier(tmp_path: Path) -> None:
    import gzip

    plain, packed = tmp_path / "f.json", tmp_path / "g.json.gz"
    plain.write_text('{"a": 1}\n{"a": 2}\n')
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    schema = pa.schema([("a", pa.int32()), ("_corrupt_record", pa.string())])
    sizes = {str(plain): plain.stat().st_size, str(packed): packed.stat().st_size}
    reader = file_readers.RecordReader(fsspec.filesystem("file"), "json", schema, {}, sizes)
    for path in (plain, packed):  # the bytes read are the file's, compressed or not
        assert [b.to_pydict()["a"] for b in reader(str(path))] == [[1, 2]]
    short = file_readers.RecordReader(fsspec.filesystem("file"), "json", schema, {}, {str(plain): 40})
    with pytest.raises(OSError, match=r"read 18 of the 40 bytes of file://.*f\.json cut into the barrier"):
        list(short(str(plain)))


def test_file_column_labels_match_what_spark_gives() -> None:
    fs = fsspec.filesystem("file")
    assert file_scans.FileColumn("f").label(fs, "/d/a b%.json") == "file:///d/a%20b%25.json"
    assert file_scans.FileColumn("f", "name").label(fs, "/d/a b.json") == "a b.json"


def test_executors_get_the_drivers_aws_environment_unless_the_filesystem_has_credentials(monkeypatch) -> None:
    import pickle

    import s3fs

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    bare = for_executors(s3fs.S3FileSystem(skip_instance_cache=True))
    shipped = pickle.loads(pickle.dumps(bare)).storage_options
    assert (shipped["key"], shipped["secret"], shipped["endpoint_url"]) == ("AKENV", "env-secret", "http://127.0.0.1:1")
    own = s3fs.S3FileSystem(skip_instance_cache=True, key="AKOWN", secret="own", endpoint_url="http://own")
    assert for_executors(own).storage_options == own.storage_options
    local = fsspec.filesystem("file")
    assert for_executors(local) is local
    assert "env-secret" not in repr(file_readers.ParquetReader(bare, pa.schema([])))


def test_read_schemas_are_nullable_throughout() -> None:
    from pyspark.sql.types import ArrayType, LongType, StructField, StructType

    strict = StructType([StructField("a", LongType(), False), StructField("b", ArrayType(LongType(), False), False)])
    loose = file_scans.as_nullable(strict)
    assert [f.nullable for f in loose.fields] == [True, True] and loose.fields[1].dataType.containsNull


def test_a_damaged_page_is_caught_by_its_crc_and_names_the_file(tmp_path: Path) -> None:
    fs = fsspec.filesystem("file")
    part = file_io._PartFile(fs, f"{tmp_path}/part-0.parquet", "none")
    part.add(pa.table({"v": list(range(10_000))}))
    path = part.close()[0]
    data = bytearray(Path(path).read_bytes())
    data[len(data) // 2] ^= 0x55  # inside the one data page
    Path(path).write_bytes(bytes(data))
    reader = file_readers.ParquetReader(fs, pa.schema([("v", pa.int64())]))
    with pytest.raises(OSError, match=f"corrupt Parquet file file://{path}: .*CRC"):
        list(reader(path))
