"""Talking to Kafka: the Airflow connection's client configuration, and what the trigger asks the broker.

The configuration is the ``extra`` of an Airflow ``kafka`` connection (the Apache Kafka
provider's ``kafka_config_id``): librdkafka properties such as ``bootstrap.servers`` and the
``security.protocol``/``sasl.*`` settings. It is untrusted input: only string, number and
boolean values are taken, callbacks are refused (the executors get the configuration as data),
and no message ever names a secret value.

End offsets come from a fetch, not from ``ListOffsets``: a consumer reads each partition from
near its listed end up to the end-of-partition event, whose offset is the true end. A broker
whose ``ListOffsets(latest)`` answers behind the end (the Tansu broker does after batched
produces) then costs a short read, never a wrong barrier.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.connectors.kafka.offsets import TOPIC, TopicPartition
from airflow_provider_checkpoint.exceptions import KafkaSourceError, KafkaUnavailableError, shorten

if TYPE_CHECKING:
    from confluent_kafka import Consumer

TIMEOUT_SECONDS = 30.0
"""How long one broker question may take before the broker counts as unreachable."""
POLL_SECONDS = 0.05
"""How long one ``consume`` call waits for more messages: it returns early only when it has a full batch."""
_SECRET = re.compile(r"(password|secret|token|key\.pem|keystore|credentials)", re.IGNORECASE)
_OURS = ("group.id", "enable.auto.commit", "enable.partition.eof", "auto.offset.reset", "isolation.level")
_CALLBACKS = ("error_cb", "throttle_cb", "stats_cb", "log_cb", "oauth_cb", "on_commit")


def connection_config(kafka_config_id: str) -> dict[str, str]:
    """The client configuration of Airflow connection ``kafka_config_id``, validated (see the module)."""
    from airflow.providers.apache.kafka.hooks.base import KafkaBaseHook

    try:
        extra = KafkaBaseHook(kafka_config_id).get_connection(kafka_config_id).extra_dejson
    except Exception as e:  # Airflow's "connection not defined" and friends
        raise KafkaSourceError(f"Kafka connection {kafka_config_id!r}: {shorten(e)}") from e
    return check_config(kafka_config_id, extra)


def check_config(kafka_config_id: str, extra: Any) -> dict[str, str]:
    """``extra`` as librdkafka properties: refused unless an object of plain values with ``bootstrap.servers``."""
    where = f"Kafka connection {kafka_config_id!r}"
    if not isinstance(extra, dict) or not extra:
        raise KafkaSourceError(f"{where}: its extra must be a JSON object of client properties")
    config: dict[str, str] = {}
    for key, value in extra.items():
        if not isinstance(key, str) or not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,99}", key):
            raise KafkaSourceError(f"{where}: {shorten(key)} is not a client property name")
        if key in _CALLBACKS:
            raise KafkaSourceError(f"{where}: callback {key} is not supported (the executors get plain values)")
        shown = "<redacted>" if _SECRET.search(key) else shorten(value)
        if isinstance(value, bool):
            value = "true" if value else "false"
        if not isinstance(value, str | int | float) or "\0" in str(value):
            raise KafkaSourceError(f"{where}: {key} must be a string, number or boolean, got {shown}")
        config[key] = str(value)
    if not config.get("bootstrap.servers"):
        raise KafkaSourceError(f"{where}: its extra names no bootstrap.servers")
    return config


def redacted(config: Mapping[str, str]) -> dict[str, str]:
    return {k: "<redacted>" if _SECRET.search(k) else v for k, v in config.items()}


def consumer_config(config: Mapping[str, str], group: str | None = None) -> dict[str, Any]:
    """A consumer that reads assigned partitions only and commits nothing unless asked."""
    own = {k: v for k, v in config.items() if k not in _OURS}
    return {
        **own,
        "group.id": group or f"airflow-checkpoint-read-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "socket.timeout.ms": int(TIMEOUT_SECONDS * 1000),
    }


def _consumer(config: Mapping[str, str], group: str | None = None) -> Consumer:
    from confluent_kafka import Consumer

    return Consumer(consumer_config(config, group))


class Broker:
    """One consumer for the trigger's questions (topics, partitions, offsets): one connection, closed on exit."""

    def __init__(self, config: Mapping[str, str]) -> None:
        self.config = config
        self.consumer = _consumer(config)

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.consumer.close()

    @property
    def servers(self) -> str:
        return self.config.get("bootstrap.servers", "?")

    def partitions(self, topics: Sequence[str] | None, pattern: str | None) -> list[TopicPartition]:
        """The partitions of ``topics`` (each must exist) or of every topic matching ``pattern``, in order."""
        try:
            metadata = self.consumer.list_topics(timeout=TIMEOUT_SECONDS)
        except Exception as e:  # KafkaException: transport failure, timeout
            raise KafkaUnavailableError(f"Kafka broker {self.servers} cannot be reached: {shorten(e)}") from e
        found = {name: t for name, t in metadata.topics.items() if TOPIC.match(name) and t.error is None}
        if topics is not None:
            missing = [t for t in topics if t not in found]
            if missing:
                raise KafkaSourceError(
                    f"Kafka topic(s) {', '.join(missing)} do not exist on {self.servers} "
                    f"(it has: {', '.join(sorted(n for n in found if not n.startswith('__'))[:20]) or 'none'})"
                )
            names = list(topics)
        else:
            assert pattern is not None
            names = sorted(n for n in found if re.fullmatch(pattern, n) and not n.startswith("__"))
        return [(name, p) for name in names for p in sorted(found[name].partitions)]

    def _watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        from confluent_kafka import TopicPartition as KafkaPartition

        try:
            low, high = self.consumer.get_watermark_offsets(
                KafkaPartition(topic, partition), timeout=TIMEOUT_SECONDS, cached=False
            )
        except Exception as e:
            raise KafkaUnavailableError(
                f"Kafka broker {self.servers}: offsets of {topic}[{partition}] unavailable: {shorten(e)}"
            ) from e
        return int(low), int(high)

    def earliest(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The first offset each partition still holds (its log start)."""
        return {(topic, partition): self._watermarks(topic, partition)[0] for topic, partition in tps}

    def ends(self, tps: Sequence[TopicPartition], known: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """The end offset (the next offset to be written) of every partition of ``tps``, read by a fetch:
        from ``max(known offset, listed end - 1)`` to the end-of-partition event."""
        from confluent_kafka import KafkaError
        from confluent_kafka import TopicPartition as KafkaPartition

        if not tps:
            return {}
        starts = [max(known.get(tp, 0), self._watermarks(*tp)[1] - 1, 0) for tp in tps]
        self.consumer.assign([KafkaPartition(t, p, s) for (t, p), s in zip(tps, starts, strict=True)])
        ends: dict[TopicPartition, int] = {}
        deadline = time.monotonic() + TIMEOUT_SECONDS
        while len(ends) < len(tps):
            if time.monotonic() > deadline:
                waiting = [f"{t}[{p}]" for t, p in tps if (t, p) not in ends]
                raise KafkaUnavailableError(
                    f"Kafka broker {self.servers}: no end of partition {', '.join(waiting[:10])} within "
                    f"{TIMEOUT_SECONDS:.0f}s"
                )
            for message in self.consumer.consume(num_messages=10_000, timeout=POLL_SECONDS):
                error = message.error()
                if error is not None and error.code() == KafkaError._PARTITION_EOF:
                    ends[(str(message.topic()), int(message.partition() or 0))] = int(message.offset() or 0)
                elif error is not None:
                    raise KafkaUnavailableError(f"Kafka broker {self.servers}: {shorten(error.str())}")
        self.consumer.unassign()
        return ends

    def at_time(
        self, tps: Sequence[TopicPartition], millis: int, ends: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """The first offset of each partition whose timestamp is at or after ``millis`` (its end if none)."""
        from confluent_kafka import TopicPartition as KafkaPartition

        try:
            found = self.consumer.offsets_for_times(
                [KafkaPartition(t, p, millis) for t, p in tps], timeout=TIMEOUT_SECONDS
            )
        except Exception as e:
            raise KafkaUnavailableError(f"Kafka broker {self.servers}: offsets for a time: {shorten(e)}") from e
        out = {}
        for tp in found:
            key = (str(tp.topic), int(tp.partition))
            out[key] = ends[key] if tp.offset < 0 else min(int(tp.offset), ends[key])
        return out


def commit(config: Mapping[str, str], group: str, offsets: Mapping[TopicPartition, int]) -> None:
    """Commit ``offsets`` (the next offset to read of each partition) to consumer group ``group``."""
    from confluent_kafka import TopicPartition as KafkaPartition

    if not offsets:
        return
    consumer = _consumer(config, group)
    try:
        consumer.commit(offsets=[KafkaPartition(t, p, o) for (t, p), o in sorted(offsets.items())], asynchronous=False)
    finally:
        consumer.close()


def committed(config: Mapping[str, str], group: str, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
    """What consumer group ``group`` has committed for ``tps`` (partitions without a commit left out)."""
    from confluent_kafka import TopicPartition as KafkaPartition

    consumer = _consumer(config, group)
    try:
        got = consumer.committed([KafkaPartition(t, p) for t, p in tps], timeout=TIMEOUT_SECONDS)
    finally:
        consumer.close()
    return {(tp.topic, tp.partition): int(tp.offset) for tp in got if tp.offset >= 0}
