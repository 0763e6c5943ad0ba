"""A CDC checkpoint's change rows kept on the driver for an upsert sink merged there, without Spark.

:class:`~.cdc.PostgresCdcSource` decodes a checkpoint's changes into Arrow on the driver in any case.
When its only consumer is an upsert sink merged on the driver
(:meth:`~airflow_provider_checkpoint.connectors.base.sink.Sink.takes_source_rows`), :func:`source_rows`
hands it those rows as ``DataFrame.toArrow`` would give them (the sink reduces them to one row per key by
its rule and buckets them by Spark's key hash computed on the driver:
:meth:`~airflow_provider_checkpoint.connectors.base.upsert_rule.UpsertRows.collect`), with a DataFrame of
the same rows that Spark evaluates only if the sink falls back to Spark (more rows than it merges on the
driver, keys the driver does not hash as Spark does): no ``createDataFrame``, no Spark job otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from airflow_provider_checkpoint.dataflow.driver_rows import SourceRows

DRIVER_READ_BYTES = 256 << 20
"""A checkpoint spanning at most this much WAL (barrier LSN minus the previous one) goes to such a sink
from the driver; ``0``: never."""

_CONFS = (
    "spark.sql.timestampType",
    "spark.sql.session.timeZone",
    "spark.sql.execution.arrow.useLargeVarTypes",
    "spark.sql.execution.arrow.maxRecordsPerBatch",
)


def source_rows(spark: SparkSession, data: pa.Table) -> SourceRows:
    """``data`` as :class:`SourceRows`: ``rows`` exactly as ``arrow_frame(spark, data).toArrow()`` gives
    them (the Spark types ``createDataFrame`` infers, timestamps localized as it does), and ``df``, a
    DataFrame of those rows in one partition, in order, computed from the driver's copy only when Spark
    evaluates it."""
    from pyspark.sql.pandas.types import _check_arrow_table_timestamps_localize, from_arrow_schema, to_arrow_schema

    from airflow_provider_checkpoint.dataflow.driver_rows import SourceRows

    timestamp_type, timezone, large, per_batch = (spark.conf.get(c) for c in _CONFS)
    schema = from_arrow_schema(data.schema, prefer_timestamp_ntz=timestamp_type == "TIMESTAMP_NTZ")
    arrow = to_arrow_schema(schema, timezone="UTC", prefers_large_types=large == "true")
    rows = _check_arrow_table_timestamps_localize(data, schema, True, timezone).cast(arrow)
    batches = [b for b in rows.to_batches(max_chunksize=int(per_batch or 10_000)) if b.num_rows]

    def emit(_: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from batches

    df = spark.range(1, numPartitions=1).mapInArrow(emit, schema)
    return SourceRows(df, rows)
