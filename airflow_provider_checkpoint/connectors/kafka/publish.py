"""Publishing a checkpoint's staged records in one Kafka transaction that also records it as published.

One transactional producer per (job, sink): its ``transactional.id`` is fixed, so the broker lets
exactly one of them act at a time. :meth:`Publisher.open` calls ``init_transactions``, which bumps
the producer epoch: an older producer of the same id (a finalize still running, a zombie) is
fenced, and a transaction it left open (a finalize killed between produce and commit) is aborted,
or completed if its commit had been sent. Only then is the **published marker** read: the
offset that the sink's consumer group (named like the transactional id) holds on partition 0 of
the target topic, whose metadata lists the last :data:`HISTORY` published checkpoints as
``[id, token]``. The marker is written by ``send_offsets_to_transaction`` inside the same
transaction as the records, so "checkpoint N's records are in the topic" and "checkpoint N is
published" become visible together, or not at all. The marker is read with
``isolation.level=read_committed`` (``require_stable``): a transaction still completing is waited for.

A checkpoint counts as published when its ``(id, token)`` is in the history, or when the history is
full and the checkpoint was staged before every checkpoint in it (a restore of an old checkpoint:
commits happen in id order, so it was published before the window). The token is drawn by the step
that staged the records and kept in the committable: 16 hex digits of the staging time in
milliseconds, then 16 random ones. A job that lost its storage and counts its ids from 1 again
stages with newer tokens, so its reused ids are never taken for the old ones.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.connectors.kafka import client, refusals
from airflow_provider_checkpoint.core.faults import fault_point
from airflow_provider_checkpoint.exceptions import (
    KafkaSourceError,
    KafkaUnavailableError,
    SinkConnectionError,
    SinkUnavailableError,
    shorten,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from confluent_kafka import KafkaError, Producer

log = logging.getLogger(__name__)

HISTORY = 32
"""How many published checkpoints the marker lists (its metadata stays far below the broker's
``offset.metadata.max.bytes``, 4096 by default)."""
TOKEN = re.compile(r"^[0-9a-f]{32}$")
_BATCH = 10_000
"""Records turned into Python objects at a time; the producer's events are served after each batch."""


@dataclass(frozen=True)
class Marker:
    """The published checkpoints ``[(id, token), ...]``, oldest first, as the marker's metadata holds them."""

    history: tuple[tuple[int, str], ...] = ()

    @classmethod
    def parse(cls, metadata: str | None, where: str) -> Marker:
        """The marker from its (untrusted) metadata; ``None`` or empty: nothing published yet. Anything
        else than the shape :meth:`metadata` writes is refused: a group we did not write is not ours."""
        if not metadata:
            return cls()
        try:
            document = json.loads(metadata)
            entries = document["published"]
            history = tuple((int(i), str(t)) for i, t in entries)
            valid = all(type(i) is int and i >= 1 and TOKEN.match(t) for (i, t) in entries) and len(history) <= HISTORY
        except (ValueError, TypeError, KeyError) as e:
            raise SinkConnectionError(f"{where}: its offset metadata is not a published marker: {shorten(e)}") from e
        if not valid:
            raise SinkConnectionError(f"{where}: its offset metadata is not a published marker: {shorten(metadata)}")
        return cls(history)

    def metadata(self) -> str:
        return json.dumps({"published": [list(e) for e in self.history]}, separators=(",", ":"))

    def published(self, checkpoint_id: int, token: str) -> bool:
        """Listed, or older than the whole full list by id *and* by staging time: a restored checkpoint
        published before the list's window. Both must hold: by id alone a job that lost its storage (ids
        from 1 again) would skip its new checkpoints; by time alone a worker whose clock lags would."""
        if (checkpoint_id, token) in self.history:
            return True
        return (
            len(self.history) == HISTORY
            and all(i > checkpoint_id for i, _ in self.history)
            and all(t[:16] > token[:16] for _, t in self.history)
        )

    def latest(self) -> int:
        return max((i for i, _ in self.history), default=0)

    def add(self, checkpoint_id: int, token: str) -> Marker:
        return Marker((*self.history, (checkpoint_id, token))[-HISTORY:])


def new_token(now: float) -> str:
    """A checkpoint's token staged at ``now`` (seconds): the time in milliseconds, then randomness."""
    return f"{int(now * 1000):016x}{uuid.uuid4().hex[:16]}"


def read_marker(config: Mapping[str, str], name: str, group: str, topic: str) -> Marker:
    """The published marker that consumer group ``group`` holds on partition 0 of ``topic`` (``read_committed``)."""
    from confluent_kafka import TopicPartition

    consumer, refusals = client.watched_consumer(config, group)
    try:
        asked = [TopicPartition(topic, 0)]
        got = client.first_contact(consumer, refusals, name, config, lambda t: consumer.committed(asked, timeout=t))
    finally:
        consumer.close()
    found = [tp for tp in got if tp.offset >= 0]
    return Marker.parse(found[0].metadata if found else None, f"Kafka sink group {group!r}")


class Publisher:
    """The sink's transactional producer and its marker group, for one commit (a context manager)."""

    def __init__(
        self, config: Mapping[str, str], name: str, transactional_id: str, topic: str, timeout_ms: int
    ) -> None:
        self.config, self.name, self.topic = config, name, topic
        self.transactional_id, self.timeout_ms = transactional_id, timeout_ms
        self.refusals = refusals.Refusals()
        self.failures: list[KafkaError] = []
        self.producer: Producer | None = None

    @property
    def where(self) -> str:
        return f"Kafka sink group {self.transactional_id!r} on {self.config.get('bootstrap.servers', '?')}"

    def __enter__(self) -> Publisher:
        from confluent_kafka import Producer

        self.producer = Producer(
            {
                **{k: v for k, v in self.config.items() if k not in ("group.id", "isolation.level")},
                "transactional.id": self.transactional_id,
                "transaction.timeout.ms": self.timeout_ms,
                "enable.idempotence": True,
                "acks": "all",
                "partitioner": "murmur2_random",  # the Java client's default: same key, same partition
                # a commit sends its whole checkpoint at once: full batches, and a Python callback only
                # for a record that failed (each record's report costs more than producing it); one
                # callback for all records: none is registered per record
                "linger.ms": 50,
                "batch.size": 1_000_000,
                "delivery.report.only.error": True,
                "on_delivery": self._report,
                "error_cb": self.refusals,
            }
        )
        try:
            self.producer.init_transactions(client.TIMEOUT_SECONDS)
        except Exception as e:
            raise self._failed(e, "init_transactions") from e
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the producer; a producer already failed (fenced: the transaction is aborted) raises nothing
        here, so the error :meth:`publish` raised, named and classified, is the one that stands."""
        if self.producer is not None:
            producer, self.producer = self.producer, None
            try:
                producer.flush(0)
            except Exception as e:
                log.warning("%s: closing the producer: %s", self.where, shorten(e))

    def _failed(self, e: Exception, what: str) -> Exception:
        found = client._error(e)
        self.refusals.check(self.name, self.config)
        if refusals.refused(found):
            return refusals.refusal(self.name, self.config, found)
        if found is not None and found.name() in ("INVALID_TRANSACTION_TIMEOUT", "_INVALID_ARG"):
            return SinkConnectionError(
                f"{self.where}: the broker refused transaction.timeout.ms={self.timeout_ms} ({found.name()}): "
                "it must be at most the broker's transaction.max.timeout.ms (900000 by default); lower the sink's "
                "transaction_timeout_ms or raise the broker's limit"
            )
        return SinkUnavailableError(f"{self.where}: {what} failed: {shorten(e)}")

    def marker(self) -> Marker:
        """The published marker as committed, read after ``init_transactions`` resolved what a fenced
        producer left (a transaction still completing is waited for)."""
        try:
            return read_marker(self.config, self.name, self.transactional_id, self.topic)
        except (SinkConnectionError, KafkaSourceError, KafkaUnavailableError):
            raise
        except Exception as e:
            raise self._failed(e, "reading the published marker") from e

    def partitions(self) -> int:
        """How many partitions the target topic has (it must exist)."""
        assert self.producer is not None
        try:
            topics = self.producer.list_topics(self.topic, timeout=client.TIMEOUT_SECONDS).topics
        except Exception as e:
            raise self._failed(e, "metadata") from e
        found = topics.get(self.topic)
        if found is None or found.error is not None or not found.partitions:
            raise SinkConnectionError(f"{self.where}: topic {self.topic!r} does not exist: create it first")
        return len(found.partitions)

    def publish(self, checkpoint_id: int, token: str, marker: Marker, records: pa.Table, sink: str) -> int:
        """Produce ``records`` (the staged columns, :func:`~.sink.staged_schema`) and the marker with
        ``(checkpoint_id, token)`` added in one transaction; how many records it holds. Any failure aborts
        the transaction (nothing of it becomes visible)."""
        from confluent_kafka import Consumer, TopicPartition

        producer = self.producer
        assert producer is not None
        producer.begin_transaction()
        try:
            self._produce(producer, records)
            if producer.flush(client.TIMEOUT_SECONDS):
                raise SinkUnavailableError(f"{self.where}: records of checkpoint {checkpoint_id} not delivered")
            self._check_delivered(checkpoint_id)
            fault_point("finalize.inside_sink_commit", checkpoint=checkpoint_id, sink=sink)
            group = Consumer({**client.consumer_config(self.config, self.transactional_id)})
            try:
                offset = TopicPartition(self.topic, 0, checkpoint_id, marker.add(checkpoint_id, token).metadata())
                producer.send_offsets_to_transaction([offset], group.consumer_group_metadata(), client.TIMEOUT_SECONDS)
            finally:
                group.close()
            producer.commit_transaction(client.TIMEOUT_SECONDS)
        except BaseException as e:
            try:
                producer.abort_transaction(client.TIMEOUT_SECONDS)
            except Exception:  # fenced, or the broker gone: the next init_transactions aborts it
                log.warning(
                    "%s: transaction of checkpoint %d not aborted; the next commit aborts it", self.where, checkpoint_id
                )
            if isinstance(e, Exception) and client._error(e) is not None:  # a KafkaException: named, classified
                raise self._failed(e, f"the transaction of checkpoint {checkpoint_id}") from e
            raise
        return records.num_rows

    def _produce(self, producer: Producer, records: pa.Table) -> None:
        """Hand every record to the producer, in order: a batch of columns at a time as Python objects, one
        ``produce`` call per record and nothing else per record (this loop is the commit's cost)."""
        import pyarrow.compute as pc

        produce, topic = producer.produce, self.topic
        for batch in records.to_batches(max_chunksize=_BATCH):
            keys, values = batch.column(0).to_pylist(), batch.column(1).to_pylist()
            partitions = pc.fill_null(batch.column(3), -1).to_pylist()  # -1: the partitioner's choice
            column = batch.column(2)
            headers = (
                [None if h is None else [(e["key"], e["value"]) for e in h] for h in column.to_pylist()]
                if column.null_count < len(column)
                else [None] * len(column)
            )
            for key, value, partition, pairs in zip(keys, values, partitions, headers, strict=True):
                while True:
                    try:
                        produce(topic, value, key, partition, headers=pairs)
                        break
                    except BufferError:  # the local queue is full: let it drain, then this record again
                        producer.poll(0.01)
            producer.poll(0)

    def _report(self, error: KafkaError | None, _message: object) -> None:
        if error is not None:
            self.failures.append(error)

    def _check_delivered(self, checkpoint_id: int) -> None:
        if self.failures:
            first = self.failures[0]
            if refusals.refused(first):
                raise refusals.refusal(self.name, self.config, first)
            raise SinkUnavailableError(
                f"{self.where}: {len(self.failures)} record(s) of checkpoint {checkpoint_id} refused: "
                f"{first.name()}: {shorten(first.str())}"
            )
