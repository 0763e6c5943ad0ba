"""KafkaSource: Kafka topics as a replayable source; the barrier is the partitions' end offsets."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.connectors.files.dead_letters import SCHEMA as DEAD_LETTERS
from airflow_provider_checkpoint.connectors.files.dead_letters import DeadLetterSink, reason
from airflow_provider_checkpoint.connectors.kafka import barrier, client
from airflow_provider_checkpoint.connectors.kafka.json_values import source_schema
from airflow_provider_checkpoint.connectors.kafka.offsets import TOPIC, Offsets, split
from airflow_provider_checkpoint.connectors.kafka.reader import FLAW, LOST, raw_schema, read_tasks
from airflow_provider_checkpoint.connectors.kafka.records import (
    CORRUPT,
    WHERE,
    first_malformed,
    latest,
    malformed,
    read_counts,
)
from airflow_provider_checkpoint.connectors.kafka.values import FORMATS, METADATA, TOMBSTONE, RecordColumns
from airflow_provider_checkpoint.core.documents import JsonDict
from airflow_provider_checkpoint.dataflow.defaults import SourceDefaults, check_malformed_policy, resolve_malformed
from airflow_provider_checkpoint.dataflow.graph import Sink, Source
from airflow_provider_checkpoint.exceptions import (
    MalformedInputError,
    PipelineDefinitionError,
    TooManyMalformedError,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from airflow_provider_checkpoint.dataflow.context import StepContext

log = logging.getLogger(__name__)

_STARTS = ("earliest", "latest")


def _where(ctx: StepContext) -> dict[str, object]:
    return {"checkpoint": ctx.checkpoint_id, "step": ctx.step, "attempt": ctx.attempt}


class KafkaSource(Source):
    """Records of Kafka topics, exactly once per completed checkpoint, through an Airflow ``kafka``
    connection (``kafka_config_id``, the Apache Kafka provider's; its extra holds the client
    properties: ``bootstrap.servers``, ``security.protocol``, ``sasl.*``).

    **Topics**: ``topics`` (a list; each must exist) or ``pattern`` (a regular expression matched
    against whole topic names; a topic that starts to match joins at the next barrier from its
    earliest offset, as do partitions added to a topic).

    **The barrier** is every partition's end offset at trigger time; a step reads exactly
    ``[previous end, this end)`` of every partition, on the executors, whatever control records
    occupy offsets in between; ``max_records_per_checkpoint`` bounds a backlog (each partition
    gets a share proportional to its backlog). ``min_partitions`` splits large ranges over more
    Spark tasks (as Structured Streaming's ``minPartitions``). ``starting_offsets`` is where the
    job's first checkpoint starts: ``"earliest"``, ``"latest"`` or a timestamp (milliseconds
    since the epoch: the first offset at or after it). A restore replays from the restored
    checkpoint's offsets; the offsets are never read back from Kafka.

    **Values**: ``format="json"`` or ``"csv"`` parsed with ``schema`` (a DDL string; ``options``
    are Spark's ``from_json``/``from_csv`` options), ``"raw"`` keeps the bytes as column ``value``.
    ``metadata_columns`` adds ``key`` (bytes), ``topic``, ``partition``, ``offset``,
    ``timestamp`` and ``headers`` (``array<struct<key, value>>``). A value that does not parse —
    under json or csv also a tombstone (null value), an empty value or bytes that are not UTF-8 —, with
    ``on_malformed="fail"``, declines the checkpoint naming the topic, partition and offset (nothing
    of that checkpoint is committed); with ``"dead_letter"`` it goes to the source's dead-letter
    table (as a file source's: ``file`` is ``topic[partition]``, ``line`` the offset), committed
    exactly once with the checkpoint. More than ``max_malformed_fraction`` malformed records
    decline the checkpoint either way. ``None`` takes the pipeline's setting.

    **Lost records**: records a barrier needs that are gone (retention, deleted records) fail
    the step naming topic, partition and offsets (``fail_on_data_loss=True``), or are skipped and
    counted in the checkpoint's stats (``source_lost``). A topic deleted and recreated since the
    previous checkpoint (a new topic id, or a partition whose recorded offset is past its end) fails
    the trigger naming it (``fail_on_data_loss=True``), or is read again from its new beginning,
    recorded in the checkpoint's stats (``source_reset``: partition → previous offset, new start).

    **Upsert reading** (``upsert=True``, Flink's ``upsert-kafka``): the topic is a changelog keyed by
    the record key. A checkpoint gives one row per key (column ``key``, bytes): its record of greatest
    offset in ``[previous, barrier)`` — Kafka orders a key's records within its partition; a key found
    in several partitions in one checkpoint (its producer changed partitioner, or the topic grew
    partitions) takes the one of the greatest (topic, partition, offset) —, with boolean column
    ``tombstone`` true when that record has a null value: the key is deleted (value columns null; a
    tombstone is then no malformed record). An upsert sink applies it with ``delete_when="tombstone"``.

    **Lag**: once a checkpoint completes, its end offsets are committed to consumer group
    ``group_id`` (default: the connection's ``group.id``, else ``airflow-checkpoint-<uid>``) so
    Kafka tooling shows the job's lag; recovery never reads them.
    """

    def __init__(
        self,
        uid: str,
        topics: Sequence[str] | None = None,
        *,
        pattern: str | None = None,
        kafka_config_id: str = "kafka_default",
        format: str = "json",
        schema: str | None = None,
        options: dict[str, str] | None = None,
        metadata_columns: Sequence[str] = ("key", "topic", "partition", "offset", "timestamp"),
        starting_offsets: str | int = "earliest",
        max_records_per_checkpoint: int | None = None,
        min_partitions: int | None = None,
        fail_on_data_loss: bool = True,
        group_id: str | None = None,
        on_malformed: str | None = None,
        max_malformed_fraction: float | None = None,
        dead_letter_path: str | None = None,
        watermark: tuple[str, str] | None = None,
        upsert: bool = False,
    ) -> None:
        super().__init__(uid, watermark)
        if (topics is None) == (pattern is None):
            raise PipelineDefinitionError(f"{uid}: give topics or pattern, exactly one of them")
        if topics is not None:
            topics = [topics] if isinstance(topics, str) else list(topics)
            bad = [t for t in topics if not isinstance(t, str) or not TOPIC.match(t)]
            if bad or not topics:
                raise PipelineDefinitionError(f"{uid}: {bad or 'no topic'} are not Kafka topic names")
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as e:
                raise PipelineDefinitionError(f"{uid}: pattern {pattern!r} is not a regular expression: {e}") from e
        if format not in FORMATS:
            raise PipelineDefinitionError(f"{uid}: format must be one of {FORMATS}, got {format!r}")
        if (schema is None) != (format == "raw"):
            raise PipelineDefinitionError(f"{uid}: format {format!r} needs {'no ' if format == 'raw' else 'a '}schema")
        unknown = [c for c in metadata_columns if c not in METADATA]
        if unknown or len(set(metadata_columns)) != len(metadata_columns):
            raise PipelineDefinitionError(f"{uid}: metadata_columns must be distinct names of {METADATA}")
        if isinstance(starting_offsets, bool) or not (
            starting_offsets in _STARTS or (isinstance(starting_offsets, int) and starting_offsets >= 0)
        ):
            raise PipelineDefinitionError(
                f"{uid}: starting_offsets must be 'earliest', 'latest' or a timestamp in milliseconds"
            )
        for name, value in (
            ("max_records_per_checkpoint", max_records_per_checkpoint),
            ("min_partitions", min_partitions),
        ):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise PipelineDefinitionError(f"{uid}: {name} must be a positive integer")
        check_malformed_policy(uid, on_malformed, max_malformed_fraction)
        if format == "raw" and on_malformed == "dead_letter":
            raise PipelineDefinitionError(f"{uid}: on_malformed='dead_letter' applies to json and csv, not raw")
        if upsert and "key" not in metadata_columns:
            raise PipelineDefinitionError(
                f"{uid}: upsert reading keys records by their Kafka key: add 'key' to metadata_columns"
            )
        if dead_letter_path is not None and on_malformed == "fail":
            raise PipelineDefinitionError(f"{uid}: dead_letter_path needs on_malformed='dead_letter'")
        self.topics, self.pattern = topics, pattern
        self.kafka_config_id = kafka_config_id
        self.format, self.schema, self.options = format, schema, dict(options or {})
        self.metadata_columns = tuple(metadata_columns)
        self.starting_offsets = starting_offsets
        self.max_records_per_checkpoint = max_records_per_checkpoint
        self.min_partitions = min_partitions
        self.fail_on_data_loss = fail_on_data_loss
        self.group_id = group_id
        self._own_policy = (on_malformed, max_malformed_fraction)
        self.on_malformed = on_malformed or "fail"
        self.max_malformed_fraction = 0.5 if max_malformed_fraction is None else max_malformed_fraction
        self.dead_letter_path = dead_letter_path
        self.upsert = upsert
        self.record_columns = RecordColumns(uid, format, schema, self.options, self.metadata_columns, upsert)
        """How the records become rows (the value's columns and the added ones)."""
        self._malformed: dict[str, DataFrame] = {}

    def attach(self, defaults: SourceDefaults | None) -> Sequence[Sink]:
        """Resolve ``on_malformed`` and ``max_malformed_fraction``; the dead-letter sink if routing to one."""
        parseable = self.format != "raw"
        policy = resolve_malformed(self.uid, self._own_policy, self.dead_letter_path, defaults, parseable)
        self.on_malformed, self.max_malformed_fraction, table = policy
        return () if table is None else [DeadLetterSink(self, table, self._dead_letters)]

    def declared_schema(self) -> str:
        return "" if self.schema is None else self.schema

    def added_columns(self) -> str:
        """``value`` (raw format) and the ``metadata_columns``, typed as the reader gives them."""
        return self.record_columns.added_ddl()

    def deletes_column(self) -> str | None:
        return TOMBSTONE if self.upsert else None

    def unique_keys(self) -> tuple[str, ...] | None:
        """Upsert reading gives one row per ``key`` in a checkpoint."""
        return ("key",) if self.upsert else None

    def describe(self) -> JsonDict:
        watched = {"topics": self.topics} if self.topics is not None else {"pattern": self.pattern}
        return {**super().describe(), **watched, "format": self.format}

    def to_spec(self) -> JsonDict:
        return {
            "uid": self.uid,
            "topics": self.topics,
            "pattern": self.pattern,
            "kafka_config_id": self.kafka_config_id,
            "format": self.format,
            "schema": self.schema,
            "options": self.options,
            "metadata_columns": list(self.metadata_columns),
            "starting_offsets": self.starting_offsets,
            "max_records_per_checkpoint": self.max_records_per_checkpoint,
            "min_partitions": self.min_partitions,
            "fail_on_data_loss": self.fail_on_data_loss,
            "group_id": self.group_id,
            "upsert": self.upsert,
        }

    # -- positions (the driver, no Spark) ------------------------------------------------
    def config(self) -> dict[str, str]:
        return client.connection_config(self.kafka_config_id)

    def initial_position(self) -> JsonDict:
        return Offsets().to_json()

    def barrier_position(self, previous: Any) -> JsonDict:
        """Every partition's end offset now (at most ``max_records_per_checkpoint`` records past
        ``previous``), and where partitions first seen now start (:func:`.barrier.cut`)."""
        return barrier.cut(self, Offsets.parse(previous, f"source {self.uid} position")).to_json()

    def new_input(self, previous: Any) -> bool:
        before = Offsets.parse(previous, f"source {self.uid} position")
        return Offsets.parse(self.barrier_position(previous)).offsets != before.offsets

    def offsets_behind(self, previous: Any, barrier: Any) -> int | None:
        """The offsets in ``[previous, barrier)`` over all partitions: the job's consumer lag at
        trigger time, up to ``max_records_per_checkpoint`` (the barrier's bound)."""
        before = Offsets.parse(previous, f"source {self.uid} position")
        return sum(end - start for _, start, end in Offsets.parse(barrier, f"source {self.uid} barrier").ranges(before))

    def on_checkpoint_committed(self, checkpoint_id: int, position: Any) -> None:
        """Commit the checkpoint's end offsets to the consumer group (lag monitoring only; idempotent)."""
        config = self.config()
        group = self.group_id or config.get("group.id") or f"airflow-checkpoint-{self.uid}"
        try:
            client.commit(config, group, Offsets.parse(position).offsets, self.kafka_config_id)
        except Exception as e:  # the lag display only: the next checkpoint commits again
            log.warning(
                "source %s: offsets of checkpoint %d not committed to group %s: %s", self.uid, checkpoint_id, group, e
            )

    # -- reading (Spark) ---------------------------------------------------------------
    def read(self, ctx: StepContext, previous: Any, barrier: Any) -> DataFrame:
        return self.read_counted(ctx, previous, barrier)[0]

    def read_counted(self, ctx: StepContext, previous: Any, barrier: Any) -> tuple[DataFrame, int]:
        """The records of ``[previous, barrier)``, parsed and cached, and their count; lost records
        are counted (``source_lost``), malformed ones decline the checkpoint."""
        df = self._records(ctx, previous, barrier).cache()
        (row,) = df.agg(*read_counts()).collect()
        good = self._judge(ctx, df, row.asDict())
        if self.on_malformed == "dead_letter":
            self._malformed[ctx.attempt_tag] = df.where(malformed())
        return self._good_of(df), good

    def read_once(self, ctx: StepContext, previous: Any, barrier: Any) -> tuple[DataFrame, Callable[[], int]]:
        """The records of ``[previous, barrier)``, uncached, counted and checked on the consumer's one pass
        (``DataFrame.observe``): the returned function raises as :meth:`read_counted` would, once that pass
        ran, before the step acks. Every declared column is parsed on that pass, used downstream or not.
        Records routed to dead letters need a second look: that source is read as :meth:`read_counted`."""
        if self.on_malformed == "dead_letter":
            return super().read_once(ctx, previous, barrier)
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        from airflow_provider_checkpoint.dataflow.observation import observed_metrics

        df, metrics = self._records(ctx, previous, barrier), read_counts()
        values = [
            F.col(f"`{c}`") for c in df.columns if c not in (CORRUPT, LOST, FLAW, *WHERE, *self.record_columns.added)
        ]
        if self.format != "raw":  # parsed in full: a value's unused field that does not parse is malformed too
            metrics.append(F.max(F.hash(*values)).alias("parsed"))
        observation = Observation()
        observed = df.observe(observation, *metrics)

        def records() -> int:
            return self._judge(ctx, df, observed_metrics(observation, lambda: df.agg(*metrics).first()))

        return self._good_of(observed), records

    def _records(self, ctx: StepContext, previous: Any, barrier: Any) -> DataFrame:
        """The records of ``[previous, barrier)`` read on the executors and parsed (:meth:`.RecordColumns.parsed`); a
        recreated topic's partitions are recorded (``source_reset``)."""
        before = Offsets.parse(previous, f"source {self.uid} position")
        cut = Offsets.parse(barrier, f"source {self.uid} barrier")
        ranges = list(cut.ranges(before))
        reset = {f"{t}[{p}]": [was, start] for (t, p), was, start in cut.reset(before)}
        if reset:
            log.warning("source %s: recreated topic partitions read from their new start: %s", self.uid, reset)
            ctx.metrics.setdefault("source_reset", {})[self.uid] = reset
        tasks = split(ranges, max(len(ranges), self.min_partitions or 0))
        text = self.format != "raw"  # json, csv: values that cannot be text are malformed (their flaw)
        fast = source_schema(self.format, self.schema, self.options, CORRUPT)
        read = read_tasks(
            self.config(), tasks, self.fail_on_data_loss, _where(ctx), self.kafka_config_id, text=text, json_schema=fast
        )
        raw = ctx.spark.range(0, len(tasks), 1, max(1, len(tasks))).mapInArrow(read, raw_schema(fast))
        return self.record_columns.parsed(raw)

    def _judge(self, ctx: StepContext, df: DataFrame, counts: dict[str, Any]) -> int:
        """The good records of ``counts`` (:func:`.records.read_counts` of ``df``); lost ones recorded
        (``source_lost``), malformed ones declining the checkpoint (``on_malformed="fail"``,
        ``max_malformed_fraction``) or recorded for dead letters."""
        records, lost, malformed = (int(counts[c] or 0) for c in ("records", "lost", "malformed"))
        if lost:
            log.warning(
                "source %s: %d record(s) gone before checkpoint %d read them", self.uid, lost, ctx.checkpoint_id
            )
            ctx.metrics.setdefault("source_lost", {})[self.uid] = lost
        if malformed and self.on_malformed == "fail":
            self._refuse_malformed(df, MalformedInputError, f"{malformed:,} of {records:,} record(s)")
        if records and malformed / records > self.max_malformed_fraction:
            share = f"{malformed / records:.1%}, more than max_malformed_fraction {self.max_malformed_fraction:g}"
            self._refuse_malformed(df, TooManyMalformedError, f"{malformed:,} of {records:,} record(s) ({share})")
        if self.on_malformed == "dead_letter":
            ctx.add_metric("malformed_records", malformed)
            ctx.metrics.setdefault("source_malformed", {})[self.uid] = malformed
        return records - malformed

    def _good_of(self, df: DataFrame) -> DataFrame:
        """The records of ``df`` neither lost nor malformed, one per key if upsert reading."""
        from pyspark.sql import functions as F

        good = df.where((F.col(LOST) == 0) & ~malformed())
        return self.record_columns.without_checks(latest(good) if self.upsert else good)

    def empty(self, spark: SparkSession) -> DataFrame:
        """The columns a checkpoint reads (the value parsed with the declared schema, the metadata columns), no rows."""
        return self.record_columns.empty(spark)

    def _dead_letters(self, ctx: StepContext) -> DataFrame | None:
        """This attempt's malformed records as dead-letter rows (``file`` = ``topic[partition]``, ``line`` = offset)."""
        from pyspark.sql.types import StructType

        malformed = self._malformed.pop(ctx.attempt_tag, None)
        if malformed is None or not ctx.metrics.get("source_malformed", {}).get(self.uid):
            return None
        declared = StructType.fromDDL(self.schema or "")
        columns = len(declared.fields) if isinstance(declared, StructType) else 0
        schema, found = self.schema or "", malformed.select(*WHERE, CORRUPT, FLAW).orderBy(*WHERE).collect()
        why = [r[4] or reason(self.format, r[3], schema, columns, self.options) for r in found]
        rows = [
            (self.uid, f"{r[0]}[{r[1]}]", r[2], r[3], w, ctx.checkpoint_id) for r, w in zip(found, why, strict=True)
        ]
        return ctx.spark.createDataFrame(rows, DEAD_LETTERS)

    def _refuse_malformed(self, df: DataFrame, error: type[MalformedInputError], what: str) -> None:
        raise error(
            f"source {self.uid}: {what} are malformed {self.format} not matching schema <{self.schema}>:\n"
            + "\n".join(first_malformed(df))
            + "\nNothing of this checkpoint was committed; fix the producer, route malformed records to "
            "dead letters (on_malformed='dead_letter'), or restore from a checkpoint past these offsets."
        )
