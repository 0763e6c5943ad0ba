"""Keyed state as Parquet, grouped by key-group range: written per checkpoint, verified on load."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.core.keygroups import range_for_index
from airflow_provider_checkpoint.core.model import OperatorSnapshot
from airflow_provider_checkpoint.storage import Location

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

ROWS_PER_FILE = 1_000_000
_RANGE_DIR = re.compile(r"/kgr=(\d+)/[^/]+\.parquet$")


def key_group(keys: tuple[str, ...], max_parallelism: int) -> Column:
    """The key group of a row: stable across Spark versions and partitionings."""
    from pyspark.sql import functions as F

    return F.pmod(F.xxhash64(*[F.col(k) for k in keys]), F.lit(max_parallelism))


def write_state(
    spark: SparkSession,
    storage: Location,
    directory: str,
    state: DataFrame,
    keys: tuple[str, ...],
    max_parallelism: int,
    parallelism: int | None = None,
) -> OperatorSnapshot:
    """Write ``state`` under ``directory`` (job-relative), one file per key-group range.

    ``parallelism`` is the number of key-group ranges (files); by default one per
    ``ROWS_PER_FILE`` rows, at most ``spark.sql.shuffle.partitions``. Any later read may
    use any other parallelism.
    """
    from pyspark.sql import functions as F

    state = state.persist()
    rows = state.count()
    if parallelism is None:
        ceiling = int(spark.conf.get("spark.sql.shuffle.partitions") or 1)
        parallelism = min(ceiling, -(-rows // ROWS_PER_FILE))
    parallelism = max(1, min(max_parallelism, parallelism))
    index = F.floor(key_group(keys, max_parallelism) * parallelism / max_parallelism).cast("int")
    if rows:
        (
            state.withColumn("kgr", index)
            .repartitionByRange(parallelism, "kgr")
            .write.partitionBy("kgr")
            .parquet(storage.url(directory))
        )
    handles = []
    for full in sorted(storage.fs.glob(storage.path(f"{directory}/kgr=*/*.parquet"))):
        match = _RANGE_DIR.search(full)
        assert match, full
        kg = range_for_index(max_parallelism, parallelism, int(match.group(1)))
        handles.append(storage.handle_for(storage.relative(full), kg))
    return OperatorSnapshot(
        handles=tuple(handles),
        schema=state.schema.json(),
        keys=keys,
        max_parallelism=max_parallelism,
        rows=rows,
    )


def read_state(spark: SparkSession, storage: Location, snapshot: OperatorSnapshot) -> DataFrame:
    """The state of ``snapshot``, after verifying every file's size and checksum."""
    from pyspark.sql.types import StructType

    schema = StructType.fromJson(json.loads(snapshot.schema))
    if not snapshot.handles:
        return spark.createDataFrame([], schema)
    for handle in snapshot.handles:
        storage.verify(handle)
    return spark.read.schema(schema).parquet(*[storage.url(h.path) for h in snapshot.handles])
