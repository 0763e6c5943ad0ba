"""A CDC checkpoint's change rows kept on the driver for an upsert sink merged there, without Spark.

:class:`~.cdc.PostgresCdcSource` decodes a checkpoint's changes into Arrow on the driver in any case.
When its only consumer is an upsert sink merged on the driver
(:meth:`~airflow_provider_checkpoint.connectors.base.sink.Sink.takes_source_rows`), :func:`source_rows`
hands it those rows as ``DataFrame.toArrow`` would give them (the sink reduces them to one row per key by
its rule and buckets them by Spark's key hash computed on the driver:
:meth:`~airflow_provider_checkpoint.connectors.base.upsert_rule.UpsertRows.collect`); the DataFrame of
the same rows is made (``createDataFrame``) only if the sink falls back to Spark (more rows than it merges
on the driver, keys the driver does not hash as Spark does): no Spark job otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from airflow_provider_checkpoint.dataflow.driver_rows import SourceRows

DRIVER_READ_BYTES = 256 << 20
"""A checkpoint spanning at most this much WAL (barrier LSN minus the previous one) goes to such a sink
from the driver; ``0``: never."""

_CONFS = (
    "spark.sql.timestampType",
    "spark.sql.session.timeZone",
    "spark.sql.execution.arrow.useLargeVarTypes",
)
_STAND_INS: dict[tuple[SparkSession, str], DataFrame] = {}
"""The stand-in frame (:func:`.unread_frame`) of each session and schema: made once (two calls into Spark),
shared by the checkpoints that read those columns (it is never evaluated)."""


def checked_bytes(uid: str, driver_read_bytes: object) -> int:
    """``driver_read_bytes`` as given to the source, refused unless an int >= 0."""
    if not isinstance(driver_read_bytes, int) or isinstance(driver_read_bytes, bool) or driver_read_bytes < 0:
        raise PipelineDefinitionError(f"{uid}: driver_read_bytes must be an int >= 0, got {driver_read_bytes!r}")
    return driver_read_bytes


def source_rows(spark: SparkSession, data: pa.Table, build: Callable[[], DataFrame]) -> SourceRows:
    """``data`` as :class:`SourceRows`: ``rows`` exactly as ``arrow_frame(spark, data).toArrow()`` gives
    them (the Spark types ``createDataFrame`` infers, timestamps localized as it does), ``df`` describing
    their columns only (:func:`.unread_frame`), and ``build`` making the DataFrame of them (the source's
    :meth:`read`), called only by a consumer that does not take the rows on the driver."""
    from pyspark.sql.pandas.types import _check_arrow_table_timestamps_localize, from_arrow_schema, to_arrow_schema

    from airflow_provider_checkpoint.dataflow.driver_rows import SourceRows, unread_frame

    timestamp_type, timezone, large = (spark.conf.get(c) for c in _CONFS)
    schema = from_arrow_schema(data.schema, prefer_timestamp_ntz=timestamp_type == "TIMESTAMP_NTZ")
    arrow = to_arrow_schema(schema, timezone="UTC", prefers_large_types=large == "true")
    rows = _check_arrow_table_timestamps_localize(data, schema, True, timezone).cast(arrow)
    key = (spark, schema.json())
    if key not in _STAND_INS:
        if len(_STAND_INS) >= 16:  # sessions stopped, schemas changed: not kept for ever
            _STAND_INS.clear()
        _STAND_INS[key] = unread_frame(spark, schema)
    return SourceRows(_STAND_INS[key], rows, build)
