"""Channels: the records one step passes to a downstream step in one checkpoint, as checksummed Parquet."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.fileio.scans import read_parquet
from airflow_provider_checkpoint.fileio.writes import write_parquet
from airflow_provider_checkpoint.state.handles import ChannelSnapshot, StateHandle
from airflow_provider_checkpoint.storage import Location

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession


def write_channel(storage: Location, directory: str, df: DataFrame, held: pa.Table | None = None) -> ChannelSnapshot:
    """Write ``df`` under ``directory`` (job-relative), from ``held`` (its rows) if the driver holds them;
    every file is hashed once, here."""
    files = write_parquet(df, storage.fs, storage.path(directory), held=held)
    handles = [StateHandle(storage.relative(f.path), f.size, f.sha256(storage.fs)) for f in files]
    return ChannelSnapshot(tuple(handles), df.schema.json(), sum(f.row_count(storage.fs) for f in files))


def read_channel(spark: SparkSession, storage: Location, channel: ChannelSnapshot) -> DataFrame:
    """The records of ``channel``, after verifying every file's size and checksum."""
    from pyspark.sql.types import StructType

    schema = StructType.fromJson(json.loads(channel.schema))
    for handle in channel.handles:
        storage.verify(handle)
    paths = [storage.path(h.path) for h in channel.handles]
    return read_parquet(spark, storage.fs, paths, schema, sizes=[h.size for h in channel.handles])
