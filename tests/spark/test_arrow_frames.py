"""Arrow tables reach Spark with every row (:func:`~airflow_provider_checkpoint.fileio.frames.arrow_frame`):
PySpark 4.2's ``createDataFrame`` stops at a table's first empty record batch."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from airflow_provider_checkpoint.fileio.frames import arrow_frame

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("sizes", [[0, 0, 16], [3, 0, 5], [5, 0], [], [4, 4]])
def test_every_row_of_a_table_with_empty_batches_reaches_spark(spark: Any, sizes: list[int]) -> None:
    schema = pa.schema([("x", pa.int64()), ("s", pa.string())])
    start = [sum(sizes[:i]) for i in range(len(sizes))]
    batches = [
        pa.record_batch(
            [pa.array(range(a, a + n), pa.int64()), pa.array([f"r{i}" for i in range(a, a + n)])], schema=schema
        )
        for a, n in zip(start, sizes, strict=True)
    ]
    table = pa.Table.from_batches(batches, schema)
    want = list(range(sum(sizes)))
    assert sorted(r["x"] for r in arrow_frame(spark, table).collect()) == want
    assert sorted(r["x"] for r in arrow_frame(spark, table, "x long, s string").collect()) == want
