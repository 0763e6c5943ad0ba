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
from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.connectors.kafka.json_values import PARSED, parse, struct_ddl
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


def raw_schema(json_schema: pa.Schema | None) -> str:
    """:data:`RAW_SCHEMA`, and with ``json_schema`` (:func:`.json_values.arrow_schema`) the column
    :data:`~.json_values.PARSED` of the values Arrow parsed."""
    return RAW_SCHEMA if json_schema is None else f"{RAW_SCHEMA}, {PARSED} {struct_ddl(json_schema)}"


BATCH_ROWS = 10_000
FETCH_BYTES = 16 * 1024 * 1024
"""Bytes a task's consumer asks per fetch of its partition unless the connection sets a fetch size:
librdkafka's default (1 MiB) makes one round trip per producer batch, 4× slower on a backlog."""
FETCH_WAIT_MS = 10
"""How long a fetch at a partition's end waits for records, unless the connection sets it."""
IDLE_SECONDS = 60.0
"""A task that receives nothing for this long while its range is unfinished gives up (broker gone)."""

Task = tuple[str, int, int, int]


def _arrow_schema(json_schema: pa.Schema | None) -> pa.Schema:
    import pyarrow as pa

    parsed = [] if json_schema is None else [(PARSED, pa.struct(list(json_schema)))]
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
            *parsed,
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
    json_schema: pa.Schema | None = None,
) -> Any:  # the function mapInArrow runs over ``spark.range(len(tasks))``
    """The ``mapInArrow`` function reading ``tasks[i]`` for each input row ``id = i`` through connection
    ``name`` (its ``config``), with each value's :data:`FLAW` if ``text``; ``where`` names the step
    attempt at the fault point ``step.kafka_read``; with ``json_schema`` values are parsed by Arrow where that
    gives Spark's answer (:mod:`.json_values`) (after a task's first batch: a kill mid-read), armed
    here in the driver, whose environment the executors' long-lived Python workers do not see."""
    from airflow_provider_checkpoint.core.faults import armed

    faults = [armed("step.kafka_read", **where, partition=task[1]) for task in tasks]

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from airflow_provider_checkpoint.core.faults import fire

        for batch in batches:
            for index in batch.column(0).to_pylist():
                for n, records in enumerate(
                    read_range(config, tasks[index], fail_on_data_loss, name, text=text, json_schema=json_schema)
                ):
                    yield records
                    for action, message in faults[index] if n == 0 else ():
                        fire("step.kafka_read", action, message)

    return read


def read_range(
    config: Mapping[str, str],
    task: Task,
    fail_on_data_loss: bool,
    name: str = "?",
    *,
    text: bool = False,
    json_schema: pa.Schema | None = None,
) -> Iterator[pa.RecordBatch]:
    """The records of ``task`` (topic, partition, start, end) as Arrow batches of :func:`raw_schema`, each
    value's :data:`FLAW` set if ``text``, parsed with ``json_schema`` where Arrow gives Spark's answer; a
    refusal of connection ``name`` is a marked :class:`KafkaSourceError` (see the module)."""
    from confluent_kafka import KafkaError, TopicPartition

    from airflow_provider_checkpoint.connectors.kafka.client import POLL_SECONDS, watched_consumer
    from airflow_provider_checkpoint.connectors.kafka.refusals import refusal, refused

    topic, partition, start, end = task
    rows = _Rows(topic, partition, text, json_schema)
    consumer, refusals = watched_consumer(fetching(config, backlog=True))
    mark = KafkaSourceError.MARK
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        expected, idle_since = start, time.monotonic()
        lost = 0
        while expected < end:
            messages = consumer.consume(num_messages=BATCH_ROWS, timeout=POLL_SECONDS)
            refusals.check(name, config, mark)
            if messages:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > IDLE_SECONDS:
                raise KafkaUnavailableError(
                    f"Kafka {topic}[{partition}]: nothing received for {IDLE_SECONDS:.0f}s at offset {expected} "
                    f"of [{start}, {end}) from {config.get('bootstrap.servers')}"
                )
            for records, error in _runs(messages):
                if error is not None:
                    if refused(error.error()):
                        raise refusal(name, config, error.error(), mark)
                    if error.error().code() != KafkaError._PARTITION_EOF:
                        raise KafkaUnavailableError(f"Kafka {topic}[{partition}]: {error.error().str()}")
                    offset = error.offset() or 0
                    if offset < end:  # the partition ends before the barrier's end: truncated
                        lost += end - max(offset, expected)
                    expected = end  # what [expected, end) still held were control or aborted records
                    continue
                offsets = [m.offset() for m in records]
                past = offsets[-1] >= end  # records past the barrier: this range is read
                if past:
                    kept = bisect_left(offsets, end)
                    records, offsets = records[:kept], offsets[:kept]
                if offsets:
                    if expected == start and offsets[0] > start:  # deleted, or aborted/control records
                        lost += _below_log_start(consumer, topic, partition, start, offsets[0])
                    rows.add(records, offsets)
                    expected = offsets[-1] + 1
                if past:
                    expected = end
                    break
            if len(rows.offsets) >= BATCH_ROWS:
                yield rows.batch()
                rows = _Rows(topic, partition, text, json_schema)
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


def fetching(config: Mapping[str, str], *, backlog: bool = False) -> dict[str, str]:
    """``config`` with our fetch settings where it sets none: a fetch waits at most :data:`FETCH_WAIT_MS` at a
    partition's end (the barrier and the reader want the end-of-partition event at once, not after
    librdkafka's 500 ms), and for a ``backlog``, :data:`FETCH_BYTES` per partition fetch."""
    ours = {"fetch.wait.max.ms": str(FETCH_WAIT_MS)}
    if backlog and "max.partition.fetch.bytes" not in config and "fetch.max.bytes" not in config:
        ours["max.partition.fetch.bytes"] = str(FETCH_BYTES)
    return {**ours, **config}


def _runs(messages: list[Any]) -> Iterator[tuple[list[Any], Any]]:
    """``messages`` as runs of records ``(records, None)`` and, one at a time, the events that carry an
    error ``([], event)``, in their order."""
    begin = 0
    for i in [i for i, m in enumerate(messages) if m.error() is not None]:
        if i > begin:
            yield messages[begin:i], None
        yield [], messages[i]
        begin = i + 1
    if begin < len(messages):
        yield messages[begin:], None


class _Rows:
    """The records of one task read so far (``confluent_kafka`` messages), made columns by :meth:`batch`."""

    def __init__(self, topic: str, partition: int, text: bool, json_schema: pa.Schema | None = None) -> None:
        self.topic, self.partition, self.text, self.json_schema = topic, partition, text, json_schema
        self.offsets: list[int] = []
        self.messages: list[Any] = []

    def add(self, messages: list[Any], offsets: list[int]) -> None:
        """Records ``messages`` at ``offsets`` (ascending, one per message)."""
        self.messages += messages
        self.offsets += offsets

    def batch(self, lost: int = 0) -> pa.RecordBatch:
        """The rows as a batch; with ``lost``, one more row (no record) carrying that count."""
        import pyarrow as pa

        schema = _arrow_schema(self.json_schema)
        messages = self.messages
        n, extra = len(messages), 1 if lost else 0
        pad: list[None] = [None] * extra
        stamps = [m.timestamp() for m in messages]
        millis = pa.array([ms if kind and ms >= 0 else None for kind, ms in stamps] + pad, pa.int64())
        values = pa.array([m.value() for m in messages], pa.binary())
        headers = [m.headers() for m in messages]
        if any(headers):
            headers = [[{"key": k, "value": v} for k, v in h] if h else None for h in headers]
        flaws = _flaws(values) if self.text else pa.nulls(n, pa.string())
        parsed = []
        if self.json_schema is not None:
            kind = schema.field(PARSED).type
            column = parse(values, self.json_schema, flaws)
            parsed = [pa.concat_arrays([column, pa.nulls(extra, kind)])]
        return pa.RecordBatch.from_arrays(
            [
                pa.array([self.topic] * (n + extra), pa.string()),
                pa.array([self.partition] * (n + extra), pa.int32()),
                pa.array(self.offsets + pad, pa.int64()),
                millis.cast(pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC")),
                pa.array([m.key() for m in messages] + pad, pa.binary()),
                pa.concat_arrays([values, pa.nulls(extra, pa.binary())]),
                pa.array(headers + pad, schema.field("headers").type),
                pa.array([0] * n + [lost] * extra, pa.int64()),
                pa.concat_arrays([flaws, pa.nulls(extra, pa.string())]),
                *parsed,
            ],
            schema=schema,
        )


def _flaws(values: pa.Array) -> pa.Array:
    """:func:`value_flaw` of each of ``values``: checked by Arrow at once (no null, no empty value, all
    UTF-8), one by one only when some value has a flaw."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if values.null_count == 0 and (len(values) == 0 or pc.min(pc.binary_length(values)).as_py() > 0):
        try:
            values.cast(pa.string())  # validates UTF-8 as Python's strict decoder does
            return pa.nulls(len(values), pa.string())
        except pa.ArrowInvalid:
            pass
    return pa.array([value_flaw(v) for v in values.to_pylist()], pa.string())
