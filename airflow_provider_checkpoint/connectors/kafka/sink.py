"""Exactly-once into a Kafka topic, for ``read_committed`` consumers: write-ahead, then one transaction.

- **Step** (writer): the checkpoint's records — key, value, headers, partition, each already bytes —
  are staged as one Parquet file in the step's own attempt directory of the checkpoint
  (``chk-<id>/<step>/attempt-<n>/kafka-<uid>.parquet``), written atomically to the job's storage:
  as durable as the checkpoint itself. The committable is ``{"checkpoint_id", "file", "records",
  "checksum", "token"}``; ``token`` (random, drawn by the step) tells this checkpoint's records apart
  from another checkpoint that ever had the same id (it starts with the staging time, :func:`~.publish.new_token`).
- **Finalize** (committer), or the next trigger on recovery: :class:`~.publish.Publisher` fences any
  other producer of the sink (``init_transactions`` on the fixed transactional id
  ``<prefix>-<job>-<uid>``, which also aborts a transaction a killed finalize left open), reads the
  published marker, and unless the checkpoint is in it produces the staged records and the marker in
  ONE transaction. Re-committing a published checkpoint produces nothing.
- **Restore**: published records cannot be withdrawn. A restore to checkpoint N leaves what later
  checkpoints published in the topic; the replay publishes their input again under new ids, so a
  ``read_committed`` consumer sees those records twice (Flink's ``KafkaSink`` does the same).
"""

from __future__ import annotations

import io
import logging
import re
import time
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.connectors.kafka import client
from airflow_provider_checkpoint.connectors.kafka.offsets import TOPIC
from airflow_provider_checkpoint.connectors.kafka.publish import (
    TOKEN,
    Marker,
    Publisher,
    new_token,
    read_marker,
)
from airflow_provider_checkpoint.connectors.kafka.sizes import check_sizes
from airflow_provider_checkpoint.core.checksums import checksum_of
from airflow_provider_checkpoint.core.documents import Fields
from airflow_provider_checkpoint.core.model import JsonDict
from airflow_provider_checkpoint.dataflow.driver_rows import frame_of
from airflow_provider_checkpoint.dataflow.graph import Node, Sink
from airflow_provider_checkpoint.exceptions import (
    DocumentError,
    KafkaSourceError,
    PipelineDefinitionError,
    SinkConnectionError,
    SinkSchemaError,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame

    from airflow_provider_checkpoint.dataflow.context import StepContext
    from airflow_provider_checkpoint.dataflow.driver_rows import LazyFrame
    from airflow_provider_checkpoint.storage import JobStorage

log = logging.getLogger(__name__)

FORMATS = ("json", "raw")
_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_STAGED = re.compile(r"^chk-\d+/[A-Za-z0-9_.-]+/attempt-\d+/kafka-[A-Za-z0-9_.-]+\.parquet$")
MAX_TRANSACTION_TIMEOUT_MS = 900_000
"""The broker's default ``transaction.max.timeout.ms``; a larger ``transaction_timeout_ms`` needs it raised."""


def staged_schema() -> pa.Schema:
    """The columns a staged file has, in order: what :meth:`KafkaSink.stage` writes and the commit accepts."""
    import pyarrow as pa

    header = pa.struct([("key", pa.string()), ("value", pa.binary())])
    return pa.schema(
        [("key", pa.binary()), ("value", pa.binary()), ("headers", pa.list_(header)), ("partition", pa.int32())]
    )


class KafkaSink(Sink):
    """Exactly-once Kafka topic for ``read_committed`` consumers (see the module and docs/kafka.md).

    :param uid: Unique id of the sink in the pipeline (names its transactional id and marker group).
    :param input: The node whose records are produced.
    :param topic: The target topic; it must exist.
    :param kafka_config_id: The Airflow ``kafka`` connection (as for :class:`~.source.KafkaSource`).
    :param key: The key column (string, bytes, or any type as its string form), a list of columns
        (their JSON object), or ``None`` (no key: records spread over partitions).
    :param format: ``"json"``: the value is the JSON object of ``value_columns``; ``"raw"``: the value
        is the column ``value_column`` (string or bytes) as it is.
    :param value_columns: ``json``: the columns of the value (default: every column except the
        headers, partition and tombstone columns).
    :param value_column: ``raw``: the value's column; a null value is a tombstone.
    :param tombstone_column: ``json``: a boolean column; where true the record is a tombstone (null
        value, the key kept), as an upsert-kafka reader deletes a key.
    :param headers_column: a column of ``array<struct<key string, value string|binary>>`` (what
        :class:`~.source.KafkaSource` gives as ``headers``) or ``map<string, string|binary>``.
    :param partition_column: an integer column choosing each record's partition; null, or no column:
        the key's murmur2 hash (the Java client's default partitioner), so one key keeps its order.
    :param transactional_id_prefix: Prefix of the transactional id and marker group,
        ``<prefix>-<job>-<uid>``.
    :param transaction_timeout_ms: The producer's ``transaction.timeout.ms``: covers one commit's
        produce only (at most the broker's ``transaction.max.timeout.ms``).
    :param step: Name of the step (Airflow task) the sink runs in.
    """

    record_kind = "kafka"
    reads_input_once = True  # stage collects its input in one Spark job (toArrow)

    def __init__(
        self,
        uid: str,
        input: Node,
        topic: str,
        kafka_config_id: str = "kafka_default",
        *,
        key: str | list[str] | None = None,
        format: str = "json",
        value_columns: list[str] | None = None,
        value_column: str = "value",
        tombstone_column: str | None = None,
        headers_column: str | None = None,
        partition_column: str | None = None,
        transactional_id_prefix: str = "airflow-checkpoint",
        transaction_timeout_ms: int = 60_000,
        step: str | None = None,
    ) -> None:
        super().__init__(uid, input, step)
        if not isinstance(topic, str) or not TOPIC.match(topic):
            raise PipelineDefinitionError(f"{uid}: {topic!r} is not a Kafka topic name")
        if format not in FORMATS:
            raise PipelineDefinitionError(f"{uid}: format must be one of {FORMATS}, got {format!r}")
        if format == "raw" and (value_columns is not None or tombstone_column is not None):
            raise PipelineDefinitionError(f"{uid}: value_columns and tombstone_column apply to format='json'")
        if not _PREFIX.match(transactional_id_prefix):
            raise PipelineDefinitionError(f"{uid}: transactional_id_prefix must match {_PREFIX.pattern}")
        if isinstance(transaction_timeout_ms, bool) or not isinstance(transaction_timeout_ms, int):
            raise PipelineDefinitionError(f"{uid}: transaction_timeout_ms must be an integer")
        if transaction_timeout_ms < 1_000:
            raise PipelineDefinitionError(f"{uid}: transaction_timeout_ms must be at least 1000")
        self.topic, self.kafka_config_id, self.format = topic, kafka_config_id, format
        self.key = [key] if isinstance(key, str) else (None if key is None else list(key))
        self.value_columns = None if value_columns is None else list(value_columns)
        self.value_column, self.tombstone_column = value_column, tombstone_column
        self.headers_column, self.partition_column = headers_column, partition_column
        self.prefix, self.transaction_timeout_ms = transactional_id_prefix, transaction_timeout_ms
        self._facts: tuple[str, int, int | None] | None = None  # the attempt prepared, its topic's facts

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "format": f"kafka/{self.format}", "topic": self.topic, "key": self.key}

    def targets(self) -> list[str]:
        return [f"kafka://{self.kafka_config_id}/{self.topic}"]

    def record_target(self) -> str:
        return f"{self.topic} ({self.kafka_config_id})"

    def transactional_id(self) -> str:
        """``<prefix>-<job>-<uid>``: one producer and one marker group per job and sink."""
        if self.job_id is None:
            raise RuntimeError(f"sink {self.uid} is not bound to a job (bind_job)")
        return f"{self.prefix}-{self.job_id}-{self.uid}"

    def required_columns(self) -> dict[str, list[str]]:
        named = {
            "key": self.key or [],
            "value_columns": self.value_columns or [],
            "value_column": [self.value_column] if self.format == "raw" else [],
            "tombstone_column": [self.tombstone_column] if self.tombstone_column else [],
            "headers_column": [self.headers_column] if self.headers_column else [],
            "partition_column": [self.partition_column] if self.partition_column else [],
        }
        return {k: v for k, v in named.items() if v}

    # -- writer (in the step) ----------------------------------------------------------
    def check_input(self, df: DataFrame) -> None:
        """The columns the parameters name exist and have types a record can be made of; reads nothing."""
        self.records(df)

    def records(self, df: DataFrame) -> DataFrame:
        """``df`` as the staged columns (:func:`staged_schema`), every value already bytes; in ``df``'s order."""
        from pyspark.sql import functions as F

        types = dict(df.dtypes)
        missing = sorted({c for cols in self.required_columns().values() for c in cols} - set(types))
        if missing:
            raise SinkSchemaError(f"sink {self.uid}: the input has no column(s) {missing} (it has {sorted(types)})")
        key = F.lit(None).cast("binary") if not self.key else self._key(F, types)
        own = {self.headers_column, self.partition_column, self.tombstone_column} - {None}
        if self.format == "raw":
            value = self._bytes(F, self.value_column, types[self.value_column], "value_column")
        else:
            columns = self.value_columns or [c for c in df.columns if c not in own]
            value = F.to_json(F.struct(*[F.col(f"`{c}`") for c in columns])).cast("binary")
            if self.tombstone_column:
                if types[self.tombstone_column] != "boolean":
                    raise SinkSchemaError(f"sink {self.uid}: tombstone_column {self.tombstone_column} must be boolean")
                value = F.when(F.col(f"`{self.tombstone_column}`"), F.lit(None).cast("binary")).otherwise(value)
        headers = self._headers(F, types)
        partition = F.lit(None).cast("int")
        if self.partition_column:
            if types[self.partition_column] not in ("tinyint", "smallint", "int", "bigint"):
                raise SinkSchemaError(f"sink {self.uid}: partition_column {self.partition_column} must be an integer")
            partition = F.col(f"`{self.partition_column}`").cast("int")
        return df.select(key.alias("key"), value.alias("value"), headers.alias("headers"), partition.alias("partition"))

    def _bytes(self, F: Any, name: str, kind: str, parameter: str) -> Column:
        if kind not in ("string", "binary"):
            raise SinkSchemaError(f"sink {self.uid}: {parameter} {name} must be string or binary, not {kind}")
        return F.col(f"`{name}`").cast("binary")

    def _key(self, F: Any, types: dict[str, str]) -> Column:
        assert self.key
        if len(self.key) > 1:
            return F.to_json(F.struct(*[F.col(f"`{c}`") for c in self.key])).cast("binary")
        column = F.col(f"`{self.key[0]}`")
        return column if types[self.key[0]] == "binary" else column.cast("string").cast("binary")

    def _headers(self, F: Any, types: dict[str, str]) -> Column:
        empty = F.lit(None).cast("array<struct<key:string,value:binary>>")
        if not self.headers_column:
            return empty
        kind = types[self.headers_column]
        column = F.col(f"`{self.headers_column}`")
        if kind in ("map<string,string>", "map<string,binary>"):
            column = F.map_entries(column)
        elif kind not in (
            "array<struct<key:string,value:string>>",
            "array<struct<key:string,value:binary>>",
        ):
            raise SinkSchemaError(
                f"sink {self.uid}: headers_column {self.headers_column} must be array<struct<key:string,"
                f"value:string|binary>> or map<string,string|binary>, not {kind}"
            )
        return F.transform(column, lambda h: F.struct(h["key"].alias("key"), h["value"].cast("binary").alias("value")))

    def prepare(self, ctx: StepContext) -> None:
        """Fail the step, before any Spark work, if the connection is refused or the topic does not exist:
        not after ``_metadata``, where the commit could only retry. Keeps what :meth:`stage` checks against
        (the topic's partitions and ``max.message.bytes``), read over this one connection."""
        self._facts = (ctx.attempt_dir, *self.topic_facts())

    def topic_facts(self) -> tuple[int, int | None]:
        """The topic's partition count and its ``max.message.bytes`` (``None``: the broker does not say), over
        one connection."""
        try:
            with client.Broker(self.config(), self.kafka_config_id) as broker:
                return len(broker.partitions([self.topic], None)), broker.max_message_bytes(self.topic)
        except KafkaSourceError as e:
            raise SinkConnectionError(f"sink {self.uid}: {e}") from e

    def _step_facts(self, ctx: StepContext) -> tuple[int, int | None]:
        """What :meth:`prepare` read for this attempt, or (a step that did not prepare) read now."""
        if self._facts is not None and self._facts[0] == ctx.attempt_dir:
            return self._facts[1], self._facts[2]
        return self.topic_facts()

    def staged_file(self, ctx: StepContext) -> str:
        return f"{ctx.attempt_dir}/kafka-{self.uid}.parquet"

    def stage(self, ctx: StepContext, data: DataFrame | LazyFrame) -> list[JsonDict]:
        """Stage the records in the checkpoint's attempt directory; they pass through the driver (as they do
        at the commit, where one producer sends them)."""
        import pyarrow.parquet as pq

        self.bind_job(ctx.plan.job_id)
        rows = self.records(frame_of(data)).toArrow().cast(staged_schema())
        if rows.num_rows:
            partitions, limit = self._step_facts(ctx)
            self._check_partitions(rows, partitions)
            check_sizes(self.uid, self.topic, rows, limit, self.config(), self.kafka_config_id)
        buffer = io.BytesIO()
        pq.write_table(rows, buffer)
        staged = buffer.getvalue()
        relative = self.staged_file(ctx)
        ctx.storage.write_atomic(relative, staged)
        ctx.add_metric("sink_rows", rows.num_rows)
        ctx.add_metric("sink_files_staged", 1)
        ctx.add_metric("sink_bytes_staged", len(staged))
        committable = {"checkpoint_id": ctx.checkpoint_id, "file": relative, "records": rows.num_rows}
        return [{**committable, "checksum": checksum_of([staged]), "token": new_token(time.time())}]

    def _check_partitions(self, rows: pa.Table, count: int) -> None:
        """A partition column's values must be partitions of the topic: refused in the step, not at the commit
        (a completed checkpoint whose records the broker refuses could never commit)."""
        import pyarrow.compute as pc

        if not self.partition_column or rows.num_rows == 0:
            return
        low, high = pc.min_max(rows["partition"]).values()
        if low.as_py() is None:
            return
        if low.as_py() < 0 or high.as_py() >= count:
            raise SinkSchemaError(
                f"sink {self.uid}: partition_column {self.partition_column} has values {low.as_py()}..{high.as_py()}, "
                f"topic {self.topic} has partitions 0..{count - 1}"
            )

    # -- committer (finalize / recovery) -------------------------------------------------
    def config(self) -> dict[str, str]:
        try:
            return client.connection_config(self.kafka_config_id)
        except KafkaSourceError as e:
            raise SinkConnectionError(str(e)) from e

    def read_committable(self, checkpoint_id: int, committables: Any, document: str) -> JsonDict:
        """The one committable of ``checkpoint_id`` if it has exactly the shape :meth:`stage` returns."""
        if not isinstance(committables, list) or len(committables) != 1:
            raise DocumentError(document, self.uid, "must be a list of one committable", committables)
        c = Fields(committables[0], document, f"{self.uid}[0]")
        if set(c.raw) != {"checkpoint_id", "file", "records", "checksum", "token"}:
            raise c.error("", "must have exactly checkpoint_id, file, records, checksum, token", sorted(c.raw))
        if c.integer("checkpoint_id", 1) != checkpoint_id:
            raise c.error("checkpoint_id", f"must be {checkpoint_id}", c.raw["checkpoint_id"])
        file = c.path("file", under=f"chk-{checkpoint_id}", pattern=_STAGED)
        if not file.endswith(f"/kafka-{self.uid}.parquet"):
            raise c.error("file", f"must be this sink's staged file kafka-{self.uid}.parquet", file)
        return {
            "checkpoint_id": checkpoint_id,
            "file": file,
            "records": c.integer("records", 0, 2**62),
            "checksum": c.string("checksum", re.compile(r"^sha256:[0-9a-f]{64}$")),
            "token": c.string("token", TOKEN),
        }

    def check_committables(self, checkpoint_id: int, committables: list[JsonDict], document: str) -> None:
        self.read_committable(checkpoint_id, committables, document)

    def job_files(self, checkpoint_id: int, committables: list[JsonDict]) -> set[str]:
        """The staged file: kept with its checkpoint (a restore's re-commit reads it) until retention deletes it."""
        document = f"committables of sink {self.uid} for checkpoint {checkpoint_id}"
        return {self.read_committable(checkpoint_id, committables, document)["file"]}

    def read_staged(self, storage: JobStorage, committable: JsonDict, document: str) -> pa.Table:
        """The staged records (:func:`staged_schema`), checked against the committable (checksum, columns, count)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        data = storage.read_bytes(committable["file"])
        if checksum_of([data]) != committable["checksum"]:
            raise DocumentError(
                document, f"{self.uid}.file", "does not have the checksum recorded", committable["file"]
            )
        try:
            table = pq.read_table(pa.BufferReader(data))
            if table.schema.names != staged_schema().names:
                raise ValueError(f"columns {table.schema.names}")
            table = table.cast(staged_schema())
        except (pa.ArrowException, ValueError) as e:
            raise DocumentError(document, f"{self.uid}.file", f"is not a staged record file: {e}") from e
        if table.num_rows != committable["records"]:
            raise DocumentError(
                document, f"{self.uid}.records", f"the file holds {table.num_rows}", committable["records"]
            )
        return table

    def commit(self, checkpoint_id: int, committables: list[JsonDict]) -> None:
        """Publish checkpoint ``checkpoint_id`` exactly once (see the module): fence, read the marker, and
        unless it is there produce the records and the marker in one transaction."""
        document = f"committables of sink {self.uid} for checkpoint {checkpoint_id}"
        committable = self.read_committable(checkpoint_id, committables, document)
        if self.job_storage is None:
            raise RuntimeError(f"sink {self.uid} has no job storage bound (bind_storage)")
        storage = self.job_storage
        config = self.config()
        with Publisher(
            config, self.kafka_config_id, self.transactional_id(), self.topic, self.transaction_timeout_ms
        ) as p:
            marker = p.marker()
            if marker.published(checkpoint_id, committable["token"]):
                log.info("sink %s: checkpoint %d already published to %s, skipped", self.uid, checkpoint_id, self.topic)
                return
            p.partitions()
            records = self.read_staged(storage, committable, document)
            count = p.publish(checkpoint_id, committable["token"], marker, records, self.uid)
        log.info(
            "sink %s: checkpoint %d published %d record(s) to %s in one transaction",
            self.uid,
            checkpoint_id,
            count,
            self.topic,
        )

    def abort(self, checkpoint_id: int) -> None:
        """Nothing outside the checkpoint: the staged file lies in its attempt directory, deleted with it."""

    def rollback(self, checkpoint_id: int) -> None:
        """Published records cannot be withdrawn from a topic: kept (docs/kafka.md, restore)."""
        log.warning(
            "sink %s: records published to %s by checkpoints after %d stay in the topic; the replay publishes "
            "their input again (read_committed consumers see those records twice)",
            self.uid,
            self.topic,
            checkpoint_id,
        )

    def published_marker(self) -> Marker:
        """The published marker as committed now, without fencing a running commit (tests, tools)."""
        return read_marker(self.config(), self.kafka_config_id, self.transactional_id(), self.topic)
