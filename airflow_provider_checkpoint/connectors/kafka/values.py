"""The columns a Kafka record becomes: its value parsed with the declared schema (``json``, ``csv``) or kept as
bytes (``raw``), beside the chosen metadata columns, and what the source's checks need until it drops them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.connectors.kafka.json_values import PARSED
from airflow_provider_checkpoint.connectors.kafka.reader import FLAW, LOST, RAW_SCHEMA
from airflow_provider_checkpoint.connectors.kafka.records import CORRUPT, WHERE
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

FORMATS = ("json", "csv", "raw")
METADATA = ("key", "topic", "partition", "offset", "timestamp", "headers")
METADATA_TYPES = {
    "key": "BINARY",
    "topic": "STRING",
    "partition": "INT",
    "offset": "BIGINT",
    "timestamp": "TIMESTAMP",
    "headers": "ARRAY<STRUCT<key: STRING, value: BINARY>>",
}
TOMBSTONE = "tombstone"
"""Upsert reading: the column saying a key's latest record is a tombstone (null value): the key is deleted."""


@dataclass(frozen=True)
class RecordColumns:
    """How the records of source ``uid`` become rows: ``format`` with ``schema`` (a DDL string, none for
    ``raw``) and Spark's ``options``, plus ``metadata_columns``; ``upsert`` adds :data:`TOMBSTONE`."""

    uid: str
    format: str
    schema: str | None
    options: dict[str, str]
    metadata_columns: tuple[str, ...]
    upsert: bool
    added: tuple[str, ...] = field(init=False)
    """The columns added to the value's: the metadata columns, and in upsert mode :data:`TOMBSTONE`."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "added", (*self.metadata_columns, TOMBSTONE) if self.upsert else self.metadata_columns)

    def added_ddl(self) -> str:
        """``value`` (raw format) and the added columns, typed as the reader gives them."""
        raw = ["value BINARY"] if self.format == "raw" else []
        types = {**METADATA_TYPES, TOMBSTONE: "BOOLEAN"}
        return ", ".join(raw + [f"{c} {types[c]}" for c in self.added])

    def parsed(self, raw: DataFrame) -> DataFrame:
        """The value of ``raw`` records parsed (or kept as bytes), the added columns, and what the checks need:
        the corrupt text, where each record was, whether it was lost, its flaw."""
        from pyspark.sql import functions as F

        meta = [F.col(c) for c in self.metadata_columns] + (
            [F.col("value").isNull().alias(TOMBSTONE)] if self.upsert else []
        )
        if self.upsert:  # a tombstone deletes its key: no malformed record
            raw = raw.withColumn(FLAW, F.when(F.col("value").isNotNull(), F.col(FLAW)))
        where = [F.col(c).alias(f"__kafka_{c}") for c in ("topic", "partition", "offset")]
        keep = [*where, F.col(LOST), F.col(FLAW)]
        if self.format == "raw":
            return raw.select(F.col("value"), *meta, F.lit(None).cast("string").alias(CORRUPT), *keep)
        ddl = f"{self.schema}, {CORRUPT} STRING"
        options = {**self.options, "mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
        text = F.col("value").cast("string")
        parsed = F.from_json(text, ddl, options) if self.format == "json" else F.from_csv(text, F.lit(ddl), options)
        if PARSED in raw.columns:  # Arrow's rows where it gives Spark's answer; Spark parses the others
            parsed = F.coalesce(F.col(PARSED), parsed)
        flawed = F.when(F.col(FLAW).isNotNull(), text).alias("__flawed")  # its text, for a dead letter
        value = raw.select(parsed.alias("__value"), *meta, *keep, flawed)
        names = value.schema["__value"].dataType.fieldNames()  # type: ignore[attr-defined]
        clash = sorted(set(names) & set(self.added))
        if clash:
            raise PipelineDefinitionError(
                f"{self.uid}: value column(s) {clash} clash with metadata_columns (or {TOMBSTONE})"
            )
        fields = [F.col(f"__value.{n}") for n in names if n != CORRUPT]
        corrupt = F.coalesce(F.col("__flawed"), F.col(f"__value.{CORRUPT}")).alias(CORRUPT)
        return value.select(*fields, corrupt, *self.added, *WHERE, LOST, FLAW)

    @staticmethod
    def without_checks(parsed: DataFrame) -> DataFrame:
        """The rows of :meth:`parsed` as the source gives them: without the columns of its checks."""
        return parsed.drop(LOST, CORRUPT, FLAW, *WHERE)

    def empty(self, spark: SparkSession) -> DataFrame:
        """The columns a checkpoint reads (the value parsed with the declared schema, the added columns), no rows."""
        return self.without_checks(self.parsed(spark.createDataFrame([], RAW_SCHEMA)))
