"""The columns a Kafka read's checks use, as Spark expressions: counts, malformed records, the latest per key."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_checkpoint.connectors.kafka.reader import FLAW, LOST

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

CORRUPT = "_corrupt_record"
"""The value's text where it did not parse (Spark's ``columnNameOfCorruptRecord``), or its flaw's text."""
WHERE = ("__kafka_topic", "__kafka_partition", "__kafka_offset")
"""Where each record was read: the columns that name it in a refusal or a dead letter."""


def read_counts() -> list[Column]:
    """The records (not lost-records rows), the lost records and the malformed records of a read."""
    from pyspark.sql import functions as F

    return [
        F.count(F.when(F.col(LOST) == 0, 1)).alias("records"),
        F.coalesce(F.sum(LOST), F.lit(0)).alias("lost"),
        F.count(F.when(malformed(), 1)).alias("malformed"),
    ]


def malformed() -> Column:
    """A record (not a lost-records row) whose value did not parse, or cannot be a record at all (its flaw)."""
    from pyspark.sql import functions as F

    return (F.col(LOST) == 0) & (F.col(CORRUPT).isNotNull() | F.col(FLAW).isNotNull())


def first_malformed(records: DataFrame, n: int = 5) -> list[str]:
    """The first ``n`` malformed records, in offset order, one line each: where, and why (its flaw or text)."""
    first = records.where(malformed()).select(*WHERE, CORRUPT, FLAW).orderBy(*WHERE).limit(n).collect()
    return [f"  {r[0]}[{r[1]}] offset {r[2]}: {r[4] or repr(str(r[3])[:200])}" for r in first]


def latest(records: DataFrame) -> DataFrame:
    """One row per ``key``: its record of greatest (topic, partition, offset) (upsert reading)."""
    from pyspark.sql import functions as F

    row = F.struct(*[F.col(f"`{c}`") for c in records.columns])
    found = records.groupBy("key").agg(F.max_by(row, F.struct(*WHERE)).alias("__latest"))
    return found.select(*[F.col("__latest")[c].alias(c) for c in records.columns])
