"""Reading offset ranges of Kafka partitions on Spark's executors, through ``confluent-kafka``.

Each Spark task reads one range ``[start, end)`` of one partition with a consumer of its
own (assigned, never subscribed, committing nothing, ``read_committed``), and yields exactly
the records whose offsets lie in the range, in offset order, whatever control records,
transaction markers or aborted records occupy offsets inside it. Records the range needs that
are gone — the range starts below the partition's log start, or the partition now ends before
``end`` — are lost:
counted in :data:`LOST` (a row of its own, without a record), or, with
``fail_on_data_loss``, a failed task naming the topic, partition and offsets.

A broker that refuses the credentials or the access (SASL login, ACL) fails the task at once
with a :class:`KafkaSourceError` carrying its :data:`~KafkaSourceError.MARK`, naming the
connection and the broker address, never a secret: the driver recognizes it
(:func:`~airflow_provider_checkpoint.exceptions.raised_in_spark`) and declines the checkpoint
as fatal, not retried; nothing of it is committed.

For text formats (``text=True``: json, csv) each record also carries its :data:`FLAW`: why its
value cannot be a record at all (:func:`value_flaw`: a tombstone, an empty value, bytes that are
not UTF-8), so the source counts it malformed instead of parsing it into a row of nulls or
replacement characters.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.exceptions import KafkaSourceError, KafkaUnavailableError

if TYPE_CHECKING:
    import pyarrow as pa

LOST = "__lost_records"
"""Set on the one row a task adds when records of its range are gone: how many."""
FLAW = "__value_flaw"
"""Why a record's value cannot be a text record (:func:`value_flaw`), null if it can or if not checked."""
RAW_SCHEMA = (
    "topic STRING, partition INT, offset LONG, timestamp TIMESTAMP, key BINARY, value BINARY, "
    f"headers ARRAY<STRUCT<key: STRING, value: BINARY>>, {LOST} LONG, {FLAW} STRING"
)
BATCH_ROWS = 10_000
IDLE_SECONDS = 60.0
"""A task that receives nothing for this long while its range is unfinished gives up (broker gone)."""

Task = tuple[str, int, int, int]


def _arrow_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("timestamp", pa.timestamp("us", tz="UTC")),
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
            (LOST, pa.int64()),
            (FLAW, pa.string()),
        ]
    )


def value_flaw(value: bytes | None) -> str | None:
    """Why ``value`` cannot be a text (json, csv) record, naming the case; ``None`` if it can be parsed.

    A tombstone (null value) and an empty value are no record; bytes that are not UTF-8 would be
    decoded with replacement characters, changing the record silently."""
    if value is None:
        return "a tombstone (null value), not a record"
    if not value:
        return "an empty value, not a record"
    try:
        value.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"not valid UTF-8: {e.reason} at byte {e.start}"
    return None


def read_tasks(
    config: Mapping[str, str],
    tasks: Sequence[Task],
    fail_on_data_loss: bool,
    where: Mapping[str, object],
    name: str = "?",
    *,
    text: bool = False,
) -> Any:  # the function mapInArrow runs over ``spark.range(len(tasks))``
    """The ``mapInArrow`` function reading ``tasks[i]`` for each input row ``id = i`` through connection
    ``name`` (its ``config``), with each value's :data:`FLAW` if ``text``; ``where`` names the step
    attempt at the fault point ``step.kafka_read`` (after a task's first batch: a kill mid-read), armed
    here in the driver, whose environment the executors' long-lived Python workers do not see."""
    from airflow_provider_checkpoint.core.faults import armed

    faults = [armed("step.kafka_read", **where, partition=task[1]) for task in tasks]

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from airflow_provider_checkpoint.core.faults import fire

        for batch in batches:
            for index in batch.column(0).to_pylist():
                for n, records in enumerate(read_range(config, tasks[index], fail_on_data_loss, name, text=text)):
                    yield records
                    for action, message in faults[index] if n == 0 else ():
                        fire("step.kafka_read", action, message)

    return read


def read_range(
    config: Mapping[str, str], task: Task, fail_on_data_loss: bool, name: str = "?", *, text: bool = False
) -> Iterator[pa.RecordBatch]:
    """The records of ``task`` (topic, partition, start, end) as Arrow batches of :data:`RAW_SCHEMA`, each
    value's :data:`FLAW` set if ``text``; a refusal of connection ``name`` is a marked
    :class:`KafkaSourceError` (see the module)."""
    from confluent_kafka import KafkaError, TopicPartition

    from airflow_provider_checkpoint.connectors.kafka.client import POLL_SECONDS, refusal, refused, watched_consumer

    topic, partition, start, end = task
    rows = _Rows(topic, partition, text)
    consumer, refusals = watched_consumer(config)
    mark = KafkaSourceError.MARK
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        expected, idle_since = start, time.monotonic()
        lost = 0
        while expected < end:
            messages = consumer.consume(num_messages=BATCH_ROWS, timeout=POLL_SECONDS)
            refusals.check(name, config, mark)
            if not messages and time.monotonic() - idle_since > IDLE_SECONDS:
                raise KafkaUnavailableError(
                    f"Kafka {topic}[{partition}]: nothing received for {IDLE_SECONDS:.0f}s at offset {expected} "
                    f"of [{start}, {end}) from {config.get('bootstrap.servers')}"
                )
            for message in messages:
                idle_since = time.monotonic()
                error = message.error()
                offset = message.offset() or 0
                if error is not None:
                    if refused(error):
                        raise refusal(name, config, error, mark)
                    if error.code() != KafkaError._PARTITION_EOF:
                        raise KafkaUnavailableError(f"Kafka {topic}[{partition}]: {error.str()}")
                    if offset < end:  # the partition ends before the barrier's end: truncated
                        lost += end - max(offset, expected)
                    expected = end  # what [expected, end) still held were control or aborted records
                    continue
                if offset >= end:
                    expected = end
                    break
                if expected == start and offset > start:  # deleted records, or aborted/control ones
                    lost += _below_log_start(consumer, topic, partition, start, offset)
                expected = offset + 1
                rows.add(offset, message)
            if len(rows.offsets) >= BATCH_ROWS:
                yield rows.batch()
                rows = _Rows(topic, partition, text)
    finally:
        consumer.close()
    if lost and fail_on_data_loss:
        raise KafkaSourceError(
            f"{KafkaSourceError.MARK}Kafka records lost: {lost:,} record(s) of {topic}[{partition}] offsets "
            f"[{start}, {end}) are gone from the broker (retention or deleted records) before this checkpoint "
            "read them. Restore from an older savepoint, or set fail_on_data_loss=False to skip them (counted "
            "in the checkpoint's stats)"
        )
    if rows.offsets or lost:
        yield rows.batch(lost)


def _below_log_start(consumer: Any, topic: str, partition: int, start: int, first: int) -> int:
    """How many offsets of ``[start, first)`` (before the first record received) lie below the partition's
    log start: records deleted (retention, ``DeleteRecords``). Offsets at or past it hold aborted or
    control records a ``read_committed`` consumer skips: not lost."""
    from confluent_kafka import TopicPartition

    low, _ = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30, cached=False)
    return max(0, min(int(low), first) - start)


class _Rows:
    """The records of one task read so far, column by column."""

    def __init__(self, topic: str, partition: int, text: bool) -> None:
        self.topic, self.partition, self.text = topic, partition, text
        self.offsets: list[int] = []
        self.millis: list[int | None] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.headers: list[list[dict[str, Any]] | None] = []
        self.flaws: list[str | None] = []

    def add(self, offset: int, message: Any) -> None:
        kind, millis = message.timestamp()
        self.offsets.append(offset)
        self.millis.append(millis if kind and millis >= 0 else None)
        self.keys.append(message.key())
        value = message.value()
        self.values.append(value)
        self.flaws.append(value_flaw(value) if self.text else None)
        headers = message.headers()
        self.headers.append([{"key": k, "value": v} for k, v in headers] if headers else None)

    def batch(self, lost: int = 0) -> pa.RecordBatch:
        """The rows as a batch; with ``lost``, one more row (no record) carrying that count."""
        import pyarrow as pa

        schema = _arrow_schema()
        n, extra = len(self.offsets), 1 if lost else 0
        pad: list[None] = [None] * extra
        millis = pa.array(self.millis + pad, pa.int64()).cast(pa.timestamp("ms", tz="UTC"))
        return pa.RecordBatch.from_arrays(
            [
                pa.array([self.topic] * (n + extra), pa.string()),
                pa.array([self.partition] * (n + extra), pa.int32()),
                pa.array(self.offsets + pad, pa.int64()),
                millis.cast(pa.timestamp("us", tz="UTC")),
                pa.array(self.keys + pad, pa.binary()),
                pa.array(self.values + pad, pa.binary()),
                pa.array(self.headers + pad, schema.field("headers").type),
                pa.array([0] * n + [lost] * extra, pa.int64()),
                pa.array(self.flaws + pad, pa.string()),
            ],
            schema=schema,
        )
