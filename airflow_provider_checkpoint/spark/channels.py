"""Channels: the records one step passes to a downstream step in one checkpoint, as checksummed Parquet."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.core.state_handles import ChannelSnapshot
from airflow_provider_checkpoint.storage import Location

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def write_channel(storage: Location, directory: str, df: DataFrame) -> ChannelSnapshot:
    """Write ``df`` under ``directory`` (job-relative); every file is hashed once, here."""
    import pyarrow.parquet as pq

    df.write.parquet(storage.url(directory))
    handles, rows = [], 0
    for full in sorted(storage.fs.glob(storage.path(f"{directory}/part-*.parquet"))):
        with storage.fs.open(full, "rb") as f:
            rows += pq.ParquetFile(f).metadata.num_rows
        handles.append(storage.handle_for(storage.relative(full)))
    return ChannelSnapshot(tuple(handles), df.schema.json(), rows)


def read_channel(spark: SparkSession, storage: Location, channel: ChannelSnapshot) -> DataFrame:
    """The records of ``channel``, after verifying every file's size and checksum."""
    from pyspark.sql.types import StructType

    schema = StructType.fromJson(json.loads(channel.schema))
    if not channel.handles:
        return spark.createDataFrame([], schema)
    for handle in channel.handles:
        storage.verify(handle)
    return spark.read.schema(schema).parquet(*[storage.url(h.path) for h in channel.handles])
