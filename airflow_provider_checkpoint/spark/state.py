"""Keyed state as Parquet, grouped by key-group range: written per checkpoint, verified on load."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.core.keygroups import range_for_index
from airflow_provider_checkpoint.core.model import InlineState, OperatorSnapshot
from airflow_provider_checkpoint.storage import Location
from airflow_provider_checkpoint.storage.job_storage import inline_parquet

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

ROWS_PER_FILE = 1_000_000
_RANGE_DIR = re.compile(r"/kgr=(\d+)/[^/]+\.parquet$")


def key_group(keys: tuple[str, ...], max_parallelism: int) -> Column:
    """The key group of a row: stable across Spark versions and partitionings."""
    from pyspark.sql import functions as F

    return F.pmod(F.xxhash64(*[F.col(k) for k in keys]), F.lit(max_parallelism))


class StateTooLargeError(ValueError):
    """State exceeds ``max_state_size`` of memory checkpoint storage; the message says what to change."""


def write_state(
    spark: SparkSession,
    storage: Location,
    directory: str,
    state: DataFrame,
    keys: tuple[str, ...],
    max_parallelism: int,
    parallelism: int | None = None,
    inline_threshold: int = 0,
    max_inline: int | None = None,
    uid: str = "",
) -> OperatorSnapshot:
    """Write ``state`` under ``directory`` (job-relative), one file per key-group range.

    ``parallelism`` is the number of key-group ranges (files); by default one per
    ``ROWS_PER_FILE`` rows, at most ``spark.sql.shuffle.partitions``. Any later read may
    use any other parallelism. State whose Parquet form is at most ``inline_threshold``
    bytes is kept inline instead (no file). ``max_inline`` set means memory checkpoint
    storage: all state inline, and :class:`StateTooLargeError` above that size.
    """
    from pyspark.sql import functions as F

    state = state.persist()
    rows = state.count()
    limit = max_inline if max_inline is not None else inline_threshold
    if rows <= limit:  # a state with more rows than bytes allowed is not even collected
        parquet = _parquet_bytes(state)
        if len(parquet) <= limit:
            return OperatorSnapshot((), state.schema.json(), keys, max_parallelism, rows, InlineState.of(parquet))
        size = f"{len(parquet)} bytes"
    else:
        size = f"{rows} rows"
    if max_inline is not None:
        raise StateTooLargeError(
            f"operator {uid}: its state ({size}) exceeds max_state_size={max_inline} bytes of memory "
            "checkpoint storage (state is kept inline, at most one row per byte); raise max_state_size "
            "(at most 64 MiB) or use checkpoint_storage='filesystem'"
        )
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


def _parquet_bytes(state: DataFrame) -> bytes:
    import io

    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(state.toArrow(), buffer, compression="zstd")
    return buffer.getvalue()


def read_state(spark: SparkSession, storage: Location, snapshot: OperatorSnapshot) -> DataFrame:
    """The state of ``snapshot``, after verifying every file's (or the inline state's) size and checksum."""
    from pyspark.sql.types import StructType

    schema = StructType.fromJson(json.loads(snapshot.schema))
    if snapshot.inline is not None:
        import io

        import pyarrow.parquet as pq

        table = pq.read_table(io.BytesIO(inline_parquet(snapshot, storage.url())))
        return spark.createDataFrame(table, schema)
    if not snapshot.handles:
        return spark.createDataFrame([], schema)
    for handle in snapshot.handles:
        storage.verify(handle)
    return spark.read.schema(schema).parquet(*[storage.url(h.path) for h in snapshot.handles])
