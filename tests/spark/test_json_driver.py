"""JSON Lines read on the driver (:mod:`~airflow_provider_checkpoint.connectors.files.json_driver`) against Spark's
JSON reader as the oracle: generated messy lines (names in other cases, undeclared and duplicate fields,
big and fractional numbers, numbers and objects where a string is declared, strings where a number is, nulls,
escapes and surrogates, non-ASCII and invalid UTF-8, byte-order marks, tabs, carriage returns, blank lines,
spaces around records, bare values, several records on a line, broken records). Wherever the driver reads,
its rows equal the source's Spark read of the same files (``read_files`` in source order, as the file
source loads them) and Spark finds no malformed record; clean files are read (the fall-back is not taken for
granted). The per-key partials the driver computes from such rows, with their key-group range and key hash,
equal Spark's partial aggregation of its own read, with Spark's range and hash. ``JSON_DRIVER_EXAMPLES`` sets the
number of drawn cases (CI: 30 files, 15 aggregations)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import fsspec
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from airflow_provider_checkpoint.connectors.files.json_driver import read_json_exactly
from airflow_provider_checkpoint.connectors.files.malformed import CORRUPT
from airflow_provider_checkpoint.fileio.scans import read_files

pytestmark = pytest.mark.spark

EXAMPLES = int(os.environ.get("JSON_DRIVER_EXAMPLES", "30"))
DECLARED = "user STRING, ts BIGINT, ok BOOLEAN"
NAMES = ["user", "ts", "ok", "User", "TS", "extra"]

values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**64), 2**64),
    st.integers(-5, 5),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
    st.text(alphabet='a\u00e9\U0001f600\\"/\x00\x1f', max_size=4),
    st.just({"a": 1}),
    st.just([1, "x"]),
)
typed = st.one_of(
    st.fixed_dictionaries({"user": st.text(max_size=6) | st.none()}),
    st.fixed_dictionaries({"ts": st.integers(-(2**63), 2**63 - 1) | st.none()}),
    st.fixed_dictionaries({"ok": st.booleans() | st.none()}),
)


@st.composite
def records(draw: st.DrawFn) -> bytes:
    """A line: mostly a record of declared names and types (sometimes with other names or values), or junk."""
    fields = draw(st.lists(typed, max_size=3))
    record = {k: v for f in fields for k, v in f.items()}
    if draw(st.integers(0, 3)) == 0:
        record.update(draw(st.dictionaries(st.sampled_from(NAMES), values, max_size=2)))
    separators = draw(st.sampled_from([(",", ":"), (", ", ": ")]))
    text = json.dumps(record, ensure_ascii=draw(st.booleans()), separators=separators)
    line = text.encode()
    tweak = draw(st.integers(0, 30))  # above 12: the record as it is
    if tweak == 1 and len(record) >= 1:  # a field repeated
        key = next(iter(record))
        line = line[:-1] + b"," + json.dumps({key: draw(values)})[1:].encode()
    elif tweak == 2:
        line = b"  " + line + b" "
    elif tweak == 3:
        line = line + b" " + line
    elif tweak == 4:
        line = draw(st.sampled_from([b"null", b"1", b'"s"', b"[]", b"true", b"{", b"}", b"", b"   ", b"{}}"]))
    elif tweak == 5:
        line = line.replace(b":", b":\t", 1)
    elif tweak == 6:
        line = line + b"\r"
    elif tweak == 7:
        line = b"\xef\xbb\xbf" + line
    elif tweak == 8:
        line = line.replace(b'"', b"'")
    elif tweak == 9:
        line = line[:-1] + b',"user":"\xff\xfe"}'
    elif tweak == 10:
        line = line[:-1] + b',"user":"\\ud800"}' if len(record) else b'{"user":"\\ud83d\\ude00"}'
    elif tweak == 11:
        line = line[: max(len(line) // 2, 1)]
    elif tweak == 12:
        number = draw(st.sampled_from([b"1.0", b"1e3", b"0123", b"-0", b'"7"', b"9223372036854775808"]))
        line = line[:-1] + b',"ts":' + number + b"}"
    return line


@st.composite
def files(draw: st.DrawFn) -> list[bytes]:
    """1 to 3 files of up to 6 lines, the last newline sometimes left out."""
    out = []
    for _ in range(draw(st.integers(1, 3))):
        lines = draw(st.lists(records(), max_size=6))
        end = draw(st.sampled_from([b"\n", b""]))
        out.append(b"\n".join(lines) + (end if lines else b""))
    return out


def spark_rows(spark: SparkSession, paths: list[str]) -> list[dict[str, object]]:
    """The rows of ``paths`` as the file source's Spark read gives them in source order."""
    declared = StructType.fromDDL(DECLARED)
    fs = fsspec.filesystem("file")
    df = read_files(spark, fs, {p: os.path.getsize(p) for p in paths}, "json", declared, {}, CORRUPT, None, True)
    return [r.asDict() for r in df.collect()]


def written(directory: Path, contents: list[bytes]) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = [str(directory / f"part-{i}.json") for i in range(len(contents))]
    for path, data in zip(paths, contents, strict=True):
        Path(path).write_bytes(data)
    return paths


def unchanged(i: int, size: int) -> None:
    raise AssertionError(f"file {i} has {size} bytes, not its size at the barrier")


def driver_rows(paths: list[str]) -> list[dict[str, object]] | None:
    read = read_json_exactly(
        fsspec.filesystem("file"), paths, [os.path.getsize(p) for p in paths], StructType.fromDDL(DECLARED), unchanged
    )
    return None if read is None else read.to_pylist()


def test_a_file_of_another_size_than_at_the_barrier_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    """A file grown after its listing is refused (the caller raises), not left to a Spark read of its new rows."""
    paths = written(tmp_path / "grown", [b'{"user":"a"}\n', b'{"user":"b"}\n{"user":"c"}\n'])
    seen: list[tuple[int, int]] = []
    sizes = [os.path.getsize(paths[0]), os.path.getsize(paths[1]) - 13]  # the second grew by a line
    read = read_json_exactly(
        fsspec.filesystem("file"), paths, sizes, StructType.fromDDL(DECLARED), lambda *c: seen.append(c)
    )
    assert read is None and seen == [(1, sizes[1] + 13)]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(contents=files())
def test_driver_rows_are_sparks(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory, contents: list[bytes]
) -> None:
    paths = written(tmp_path_factory.mktemp("json"), contents)
    rows = driver_rows(paths)
    event("read on the driver" if rows is not None else "left to Spark")
    if rows is None:
        return
    theirs = spark_rows(spark, paths)
    assert [r.pop(CORRUPT) for r in theirs] == [None] * len(theirs)
    assert rows == theirs


def test_clean_lines_are_read_as_spark_reads_them(spark: SparkSession, tmp_path: Path) -> None:
    contents = [
        b'{"user":"a","ts":1,"ok":true}\n{"ts":-0}\n{}\n{"user":null, "ok": false}\n',
        b'{"user":"\xc3\xa9\\u00e9\\n\\"","ts":-9223372036854775808}\n{"us\\u0065r":"b"}',
        b"",
    ]
    paths = written(tmp_path / "clean", contents)
    rows = driver_rows(paths)
    assert rows is not None and len(rows) == 6
    theirs = spark_rows(spark, paths)
    assert [r.pop(CORRUPT) for r in theirs] == [None] * 6
    assert rows == theirs


@pytest.mark.parametrize(
    "line",
    [b'{"ts":1.0}', b'{"user":1}', b'{"User":"a"}', b'{"user":"a","user":"b"}', b"null", b'{"user":"a"} {"user":"b"}'],
)
def test_lines_spark_reads_otherwise_go_to_spark(tmp_path: Path, line: bytes) -> None:
    paths = written(tmp_path / "other", [b'{"user":"a"}\n' + line + b"\n"])
    assert driver_rows(paths) is None


AGGS = {
    "n": "count",
    "seen": "count(ts)",
    "first": "min(ts)",
    "last": "max(ts)",
    "least": "min(user)",
    "any": "max(ok)",
}
rows_drawn = st.lists(
    st.fixed_dictionaries(
        {
            "user": st.sampled_from(["a", "b", "\u00e9", "\U0001f600", "", "B"]) | st.none(),
            "ts": st.integers(-(2**63), 2**63 - 1) | st.integers(-3, 3) | st.none(),
            "ok": st.booleans() | st.none(),
        }
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=max(EXAMPLES // 2, 1), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    rows=rows_drawn, keys=st.sampled_from([["user"], ["user", "ok"], ["ts"]]), parallelism=st.sampled_from([1, 3, 128])
)
def test_partials_and_hashes_on_the_driver_are_sparks(
    spark: SparkSession,
    tmp_path_factory: pytest.TempPathFactory,
    rows: list[dict[str, object]],
    keys: list[str],
    parallelism: int,
) -> None:
    """The per-key partials of lines read on the driver, with their key-group range and key hash, equal Spark's
    partial aggregation of its own read of the lines, with Spark's range and hash of the keys."""
    from airflow_provider_checkpoint.dataflow.aggregates import Aggregate, partials_arrow
    from airflow_provider_checkpoint.dataflow.driver_rows import KEY_HASH, key_hash
    from airflow_provider_checkpoint.state.driver_merge import hashed
    from airflow_provider_checkpoint.state.spark_backend import range_index

    paths = written(
        tmp_path_factory.mktemp("agg"), [b"\n".join(json.dumps(r, ensure_ascii=False).encode() for r in rows)]
    )
    declared = StructType.fromDDL(DECLARED)
    read = read_json_exactly(fsspec.filesystem("file"), paths, [os.path.getsize(p) for p in paths], declared, unchanged)
    assert read is not None
    aggs = {out: Aggregate.parse("t", out, spec) for out, spec in AGGS.items()}
    partials = partials_arrow(aggs, keys, read)
    assert partials is not None
    mine = hashed(partials, keys, 128, parallelism, "__kgr").to_pylist()
    fs = fsspec.filesystem("file")
    df = read_files(spark, fs, {p: os.path.getsize(p) for p in paths}, "json", declared, {}, CORRUPT, None, True)
    theirs = df.groupBy(*keys).agg(*[e for agg in aggs.values() for e in agg.partial()])
    theirs = theirs.withColumns({"__kgr": range_index(tuple(keys), 128, parallelism), KEY_HASH: key_hash(tuple(keys))})
    order = [*keys, "__kgr"]

    def ordered(table: list[dict[str, object]]) -> list[dict[str, object]]:
        return sorted(table, key=lambda r: tuple((r[k] is not None, str(r[k])) for k in order))

    assert ordered(mine) == ordered([r.asDict() for r in theirs.collect()])
