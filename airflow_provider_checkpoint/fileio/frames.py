"""DataFrames of Arrow tables the driver holds, with every row.

PySpark 4.2's ``createDataFrame(pyarrow.Table)`` stops reading a table at its first empty record
batch: the rows of every later batch are silently lost (batches of 3, 0 and 5 rows give 3 rows).
Tables built by concatenating, filtering or grouping have such batches, so every Arrow table goes
to Spark through :func:`arrow_frame`, which leaves the empty batches out (a table without rows goes as
an empty list: ``createDataFrame`` fails on an empty table with a nested column).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession


def arrow_frame(spark: SparkSession, table: pa.Table, schema: Any = None) -> DataFrame:
    """A DataFrame of every row of ``table`` (``schema``: as ``createDataFrame`` takes it, or its own)."""
    import pyarrow as pa

    batches = [b for b in table.to_batches() if b.num_rows]
    if not batches:
        from pyspark.sql.pandas.types import from_arrow_schema

        return spark.createDataFrame([], schema if schema is not None else from_arrow_schema(table.schema))
    whole = pa.Table.from_batches(batches, table.schema)
    return spark.createDataFrame(whole) if schema is None else spark.createDataFrame(whole, schema=schema)
