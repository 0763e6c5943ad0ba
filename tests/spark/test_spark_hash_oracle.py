"""Spark's ``xxhash64`` computed on the driver (numpy) against Spark's own ``F.xxhash64`` and key-group
range, over seeded random rows of every hashed type: strings of every length up to past two 32-byte
stripes (ASCII, accented, CJK, emoji, control characters), extreme integers, nulls in any column, and
keys of several columns. ``SPARK_HASH_ROWS`` sets the row count (CI: 3,000)."""

from __future__ import annotations

import os
import random
from datetime import UTC, date, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa

from airflow_provider_checkpoint.state.spark_backend import range_index
from airflow_provider_checkpoint.state.spark_hash import range_indexes, xxhash64

ROWS = int(os.environ.get("SPARK_HASH_ROWS", "3000"))
ALPHABET = "abcXYZ09 _-éüß中文字😀🎉\x00\x01\t\n\u200b"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _rows(rng: random.Random) -> pa.Table:
    def maybe(value: Any) -> Any:
        return None if rng.random() < 0.05 else value

    def text() -> str:
        return "".join(rng.choice(ALPHABET) for _ in range(rng.choice([0, 1, 3, 4, 7, 8, 15, 31, 32, 33, 40, 70])))

    ints = [-(2**31), -1, 0, 1, 2**31 - 1]
    longs = [-(2**63), -1, 0, 1, 2**63 - 1]
    columns = {
        "s": pa.array([maybe(text()) for _ in range(ROWS)], pa.string()),
        "i": pa.array([maybe(rng.choice(ints + [rng.randint(-(2**31), 2**31 - 1)])) for _ in range(ROWS)], pa.int32()),
        "l": pa.array([maybe(rng.choice(longs + [rng.randint(-(2**63), 2**63 - 1)])) for _ in range(ROWS)], pa.int64()),
        "b": pa.array([maybe(rng.random() < 0.5) for _ in range(ROWS)], pa.bool_()),
        "t": pa.array(
            [maybe(EPOCH + timedelta(microseconds=rng.randint(-(10**15), 10**16))) for _ in range(ROWS)],
            pa.timestamp("us", tz="UTC"),
        ),
        "d": pa.array([maybe(date(1900, 1, 1) + timedelta(days=rng.randint(0, 100_000))) for _ in range(ROWS)]),
    }
    return pa.table(columns)


def test_driver_hashes_and_ranges_equal_spark_over_random_rows(spark: Any) -> None:
    from pyspark.sql import functions as F

    rows = _rows(random.Random(50))
    frame = spark.createDataFrame(rows)
    keys_list = [
        ("s",),
        ("i",),
        ("l",),
        ("b",),
        ("t",),
        ("d",),
        ("s", "l"),
        ("t", "s", "i"),
        ("s", "i", "l", "b", "t", "d"),
    ]
    selected = frame.select(
        *(F.xxhash64(*keys).alias(f"h{n}") for n, keys in enumerate(keys_list)),
        *(range_index(keys, 128, 7).alias(f"r{n}") for n, keys in enumerate(keys_list)),
    ).toArrow()
    for n, keys in enumerate(keys_list):
        assert xxhash64(rows, keys).view(np.int64).tolist() == selected[f"h{n}"].to_pylist(), keys
        assert range_indexes(rows, keys, 128, 7).to_pylist() == selected[f"r{n}"].to_pylist(), keys
