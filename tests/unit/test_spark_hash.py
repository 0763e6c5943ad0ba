"""Spark's ``xxhash64`` on the driver against values Spark 4.2 computed (``F.xxhash64`` over the same rows,
seed 42), and XXH64's published test vectors (seed 0)."""

from __future__ import annotations

from datetime import UTC, date, datetime

import numpy as np
import pyarrow as pa

from airflow_provider_checkpoint.state.spark_hash import _xxh64_rows, hashable, range_indexes, xxhash64

LONG_TEXT = "héllo wörld, this string is longer than thirty-two bytes: 😀!"
ROWS = pa.table(
    {
        "s": pa.array(["", "u000042", LONG_TEXT, None]),
        "i": pa.array([0, -1, 2**31 - 1, None], pa.int32()),
        "l": pa.array([0, 2**40, -(2**63), None], pa.int64()),
        "b": pa.array([True, False, None, None]),
        "t": pa.array(
            [datetime(2026, 1, 1, tzinfo=UTC), datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), None, None],
            pa.timestamp("us", tz="UTC"),
        ),
        "d": pa.array([date(2026, 1, 1), date(1960, 1, 1), None, None], pa.date32()),
    }
)
SPARK = {  # xxhash64(<columns>) of each row, as Spark shows it (signed)
    ("s",): [-7444071767201028348, 3613421821649475545, 7365734574665376854, 42],
    ("i",): [3614696996920510707, 2017008487422258757, 1508894993788531228, 42],
    ("l",): [-5252525462095825812, 1821704621099523357, -8619748838626508300, 42],
    ("b",): [-6698625589789238999, 3614696996920510707, 42, 42],
    ("t",): [2263591397823335172, 3858142552250413010, 42, 42],
    ("d",): [-7748453683161933313, 5231712984053086986, 42, 42],
    ("s", "t", "t"): [5876401381424598430, 7377232673176099765, 7365734574665376854, 42],
    ("s", "i", "l", "b", "t", "d"): [-436326020897763900, -5381770249684870650, -9049867562733525060, 42],
}


def test_hashes_equal_spark_for_every_hashed_type_nulls_and_several_columns() -> None:
    for columns, expected in SPARK.items():
        assert xxhash64(ROWS, columns).view(np.int64).tolist() == expected, columns
    assert xxhash64(ROWS.slice(1, 2), ["s"]).view(np.int64).tolist() == SPARK[("s",)][1:3]  # a sliced column


def test_strings_hash_as_xxh64_published_vectors() -> None:
    vectors = {b"": 0xEF46DB3751D8E999, b"a": 0xD24EC4F1A98C6E5B, b"abc": 0x44BC2CF5AD770999}
    for text, expected in vectors.items():
        raw = np.frombuffer(text, np.uint8).reshape(1, len(text))
        assert int(_xxh64_rows(raw, np.zeros(1, np.uint64), len(text))[0]) == expected, text


def test_range_indexes_are_spark_pmod_then_the_range_of_the_key_group() -> None:
    hashes = np.array(SPARK[("s", "t", "t")], np.int64)
    groups = hashes % 128  # Python's and numpy's modulo of a negative number is Spark's pmod
    ranges = range_indexes(ROWS, ["s", "t", "t"], 128, 5).to_pylist()
    assert ranges == [int(g) * 5 // 128 for g in groups]
    assert all(0 <= r < 5 for r in ranges)


def test_only_types_hashed_as_spark_does_are_hashable() -> None:
    assert hashable(ROWS, ["s", "i", "l", "b", "t", "d"])
    other = pa.schema([("x", pa.decimal128(10, 2)), ("y", pa.float64()), ("z", pa.timestamp("ns"))])
    assert not any(hashable(other, [c]) for c in other.names)
