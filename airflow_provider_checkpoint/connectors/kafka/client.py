"""Talking to Kafka: the Airflow connection's client configuration, and what the trigger asks the broker.

The configuration is the ``extra`` of an Airflow ``kafka`` connection (the Apache Kafka
provider's ``kafka_config_id``): librdkafka properties such as ``bootstrap.servers`` and the
``security.protocol``/``sasl.*`` settings. It is untrusted input: only string, number and
boolean values are taken, callbacks are refused (the executors get the configuration as data),
and no message ever names a secret value.

**Refused credentials or access** end every question promptly in :class:`KafkaSourceError`
(a refusal, not retried) naming the connection and ``bootstrap.servers``: librdkafka retries a
failed SASL login forever and reports it only to an error callback, never in the answer of a
blocking call (a metadata request then just times out), so each client made here carries our
own :class:`.refusals.Refusals` callback, and the first contact asks in growing steps, serving the
callback in between. An authorization error (topic, group, cluster) in an answer is the same
refusal. A broker that does not answer stays :class:`KafkaUnavailableError` (retried).

End offsets come from a fetch, not from ``ListOffsets``: a consumer reads each partition from
near its listed end up to the end-of-partition event, whose offset is the true end. A broker
whose ``ListOffsets(latest)`` answers behind the end (some Kafka-compatible brokers do after batched
produces) then costs a short read, never a wrong barrier.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from airflow_provider_checkpoint.connectors.kafka.offsets import TOPIC, TopicPartition
from airflow_provider_checkpoint.connectors.kafka.refusals import SECRET, Refusals, refusal, refused
from airflow_provider_checkpoint.exceptions import KafkaSourceError, KafkaUnavailableError, shorten

if TYPE_CHECKING:
    from confluent_kafka import Consumer, KafkaError

T = TypeVar("T")

TIMEOUT_SECONDS = 30.0
"""How long one broker question may take before the broker counts as unreachable."""
POLL_SECONDS = 0.05
"""How long one ``consume`` call waits for more messages: it returns early only when it has a full batch."""
_OURS = ("group.id", "enable.auto.commit", "enable.partition.eof", "auto.offset.reset", "isolation.level")
_CALLBACKS = ("error_cb", "throttle_cb", "stats_cb", "log_cb", "oauth_cb", "on_commit")
FIRST_STEP_SECONDS = 0.5
"""The first contact's first wait; each next one doubles (a slow broker still gets the whole timeout)."""


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
        shown = "<redacted>" if SECRET.search(key) else shorten(value)
        if isinstance(value, bool):
            value = "true" if value else "false"
        if not isinstance(value, str | int | float) or "\0" in str(value):
            raise KafkaSourceError(f"{where}: {key} must be a string, number or boolean, got {shown}")
        config[key] = str(value)
    if not config.get("bootstrap.servers"):
        raise KafkaSourceError(f"{where}: its extra names no bootstrap.servers")
    return config


def redacted(config: Mapping[str, str]) -> dict[str, str]:
    return {k: "<redacted>" if SECRET.search(k) else v for k, v in config.items()}


def consumer_config(config: Mapping[str, str], group: str | None = None) -> dict[str, Any]:
    """A consumer that reads assigned partitions only, committed transactions only (its end of partition
    is the last stable offset), and commits nothing unless asked."""
    own = {k: v for k, v in config.items() if k not in _OURS}
    return {
        **own,
        "group.id": group or f"airflow-checkpoint-read-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "socket.timeout.ms": int(TIMEOUT_SECONDS * 1000),
    }


def watched_consumer(
    config: Mapping[str, str], group: str | None = None, **callbacks: Any
) -> tuple[Consumer, Refusals]:
    """A consumer of :func:`consumer_config` whose error callback is a new :class:`Refusals`; our ``callbacks``."""
    from confluent_kafka import Consumer

    refusals = Refusals()
    return Consumer({**consumer_config(config, group), **callbacks, "error_cb": refusals}), refusals


def _error(e: Exception) -> KafkaError | None:
    """The ``KafkaError`` a ``KafkaException`` carries."""
    from confluent_kafka import KafkaError

    found = e.args[0] if e.args else None
    return found if isinstance(found, KafkaError) else None


def first_contact(
    consumer: Consumer, refusals: Refusals, name: str, config: Mapping[str, str], ask: Callable[[float], T]
) -> T:
    """``ask(timeout)`` in growing steps (:data:`FIRST_STEP_SECONDS`, doubling) until it answers, serving the
    error callback in between: a refusal ends it at once, no answer within :data:`TIMEOUT_SECONDS` is
    :class:`KafkaUnavailableError`. The consumer must hold no assignment (serving the callback polls it)."""
    deadline, step = time.monotonic() + TIMEOUT_SECONDS, FIRST_STEP_SECONDS
    while True:
        try:
            return ask(max(min(step, deadline - time.monotonic()), 0.01))
        except Exception as e:  # KafkaException: transport failure, timeout, refusal
            found = _error(e)
            if refused(found):
                raise refusal(name, config, found) from e
            consumer.poll(0)  # serves the error callback
            refusals.check(name, config)
            if time.monotonic() >= deadline:
                raise KafkaUnavailableError(
                    f"Kafka broker {config.get('bootstrap.servers', '?')} cannot be reached: {shorten(e)}"
                ) from e
            step *= 2


class Broker:
    """One consumer for the trigger's questions (topics, partitions, offsets): one connection, closed on exit.

    ``name`` is the Airflow connection the configuration came from, named in a refusal."""

    def __init__(self, config: Mapping[str, str], name: str = "?") -> None:
        self.config, self.name = config, name
        self.consumer, self.refusals = watched_consumer(config)

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.consumer.close()

    @property
    def servers(self) -> str:
        return self.config.get("bootstrap.servers", "?")

    def partitions(self, topics: Sequence[str] | None, pattern: str | None) -> list[TopicPartition]:
        """The partitions of ``topics`` (each must exist) or of every topic matching ``pattern``, in order."""
        metadata = first_contact(
            self.consumer, self.refusals, self.name, self.config, lambda t: self.consumer.list_topics(timeout=t)
        )
        found = {name: t for name, t in metadata.topics.items() if TOPIC.match(name) and t.error is None}
        if topics is not None:
            for topic in topics:
                if topic in metadata.topics and refused(metadata.topics[topic].error):
                    raise refusal(self.name, self.config, metadata.topics[topic].error)
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

    def _failed(self, e: Exception, what: str) -> Exception:
        """The error to raise for ``e`` of a question about ``what``: a refusal, else unavailable."""
        found = _error(e)
        if refused(found):
            return refusal(self.name, self.config, found)
        return KafkaUnavailableError(f"Kafka broker {self.servers}: {what} unavailable: {shorten(e)}")

    def _watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        from confluent_kafka import TopicPartition as KafkaPartition

        try:
            low, high = self.consumer.get_watermark_offsets(
                KafkaPartition(topic, partition), timeout=TIMEOUT_SECONDS, cached=False
            )
        except Exception as e:
            raise self._failed(e, f"offsets of {topic}[{partition}]") from e
        return int(low), int(high)

    def watermarks(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, tuple[int, int]]:
        """The first offset each partition still holds (its log start) and its listed end."""
        return {tp: self._watermarks(*tp) for tp in tps}

    def earliest(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The first offset each partition still holds (its log start)."""
        return {tp: low for tp, (low, _) in self.watermarks(tps).items()}

    def topic_ids(self, topics: Sequence[str]) -> dict[str, str]:
        """The topic id of each of ``topics`` (Kafka 2.8+; a recreated topic gets a new one); a broker
        that gives none (an all-zero id, or no ``DescribeTopics``) leaves the topic out."""
        from confluent_kafka import TopicCollection
        from confluent_kafka.admin import AdminClient

        if not topics:
            return {}
        admin = AdminClient({**self.config, "error_cb": self.refusals})  # type: ignore[dict-item]
        try:
            described = admin.describe_topics(TopicCollection(list(topics)), request_timeout=TIMEOUT_SECONDS)
            ids = {
                name: str(future.result(timeout=TIMEOUT_SECONDS).topic_id or "") for name, future in described.items()
            }
        except Exception as e:
            found = _error(e)
            if refused(found):
                raise refusal(self.name, self.config, found) from e
            return {}  # a broker without topic ids: the offsets alone tell a recreated topic
        return {name: i for name, i in ids.items() if i.strip("A=0-")}  # an all-zero id is none

    def max_message_bytes(self, topic: str) -> int | None:
        """The topic's ``max.message.bytes`` (``DescribeConfigs``); ``None`` if the broker does not say (no
        permission to describe configs, or an unreadable value)."""
        from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

        admin = AdminClient({**self.config, "error_cb": self.refusals})  # type: ignore[dict-item]
        resource = ConfigResource(ResourceType.TOPIC, topic)
        try:
            entries = admin.describe_configs([resource], request_timeout=TIMEOUT_SECONDS)[resource].result(
                timeout=TIMEOUT_SECONDS
            )
        except Exception as e:
            found = _error(e)
            if found is not None and found.name() in ("TOPIC_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED"):
                return None
            raise self._failed(e, f"configuration of {topic}") from e
        entry = entries.get("max.message.bytes")
        value = getattr(entry, "value", None)
        return int(value) if isinstance(value, str) and value.isdigit() else None

    def ends(
        self,
        tps: Sequence[TopicPartition],
        known: Mapping[TopicPartition, int],
        listed: Mapping[TopicPartition, tuple[int, int]] | None = None,
    ) -> dict[TopicPartition, int]:
        """The end offset (the next offset to be written) of every partition of ``tps``, read by a fetch:
        from ``max(known offset, listed end - 1)`` (``listed``: :meth:`watermarks`, asked if not given)
        to the end-of-partition event. A known offset past the listed end is not fetched from."""
        from confluent_kafka import KafkaError
        from confluent_kafka import TopicPartition as KafkaPartition

        if not tps:
            return {}
        listed = listed if listed is not None else self.watermarks(tps)
        starts = [max(min(known.get(tp, 0), listed[tp][1]), listed[tp][1] - 1, 0) for tp in tps]
        self.consumer.assign([KafkaPartition(t, p, s) for (t, p), s in zip(tps, starts, strict=True)])
        ends: dict[TopicPartition, int] = {}
        deadline = time.monotonic() + TIMEOUT_SECONDS
        while len(ends) < len(tps):
            if time.monotonic() > deadline:
                waiting = [f"{t}[{p}] (listed end {listed[(t, p)][1]})" for t, p in tps if (t, p) not in ends]
                raise KafkaUnavailableError(
                    f"Kafka broker {self.servers}: answered, but gave no end-of-partition of "
                    f"{', '.join(waiting[:10])} within {TIMEOUT_SECONDS:.0f}s of fetching from near the listed end"
                )
            for message in self.consumer.consume(num_messages=10_000, timeout=POLL_SECONDS):
                error = message.error()
                if error is not None and error.code() == KafkaError._PARTITION_EOF:
                    ends[(str(message.topic()), int(message.partition() or 0))] = int(message.offset() or 0)
                elif refused(error):
                    raise refusal(self.name, self.config, error)
                elif error is not None:
                    raise KafkaUnavailableError(f"Kafka broker {self.servers}: {shorten(error.str())}")
            self.refusals.check(self.name, self.config)
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
            raise self._failed(e, "offsets for a time") from e
        out = {}
        for tp in found:
            key = (str(tp.topic), int(tp.partition))
            out[key] = ends[key] if tp.offset < 0 else min(int(tp.offset), ends[key])
        return out


def commit(config: Mapping[str, str], group: str, offsets: Mapping[TopicPartition, int], name: str = "?") -> None:
    """Commit ``offsets`` (the next offset to read of each partition) to consumer group ``group``; a refusal
    (:class:`KafkaSourceError`) or no answer within :data:`TIMEOUT_SECONDS` (:class:`KafkaUnavailableError`)
    raises. The login is checked first (a metadata request), so a refusal comes promptly and leaves no
    commit in flight: closing a consumer waits for one, and a refused login never finds the coordinator."""
    from confluent_kafka import TopicPartition as KafkaPartition

    if not offsets:
        return
    results: list[tuple[KafkaError | None, list[Any]]] = []
    consumer, refusals = watched_consumer(config, group, on_commit=lambda err, tps: results.append((err, tps)))
    try:
        topic = min(offsets)[0]
        first_contact(consumer, refusals, name, config, lambda t: consumer.list_topics(topic, timeout=t))
        consumer.commit(offsets=[KafkaPartition(t, p, o) for (t, p), o in sorted(offsets.items())], asynchronous=True)
        deadline = time.monotonic() + TIMEOUT_SECONDS
        while not results:
            consumer.poll(POLL_SECONDS)  # no assignment: serves the callbacks only
            refusals.check(name, config)
            if time.monotonic() > deadline:
                raise KafkaUnavailableError(f"Kafka broker {config.get('bootstrap.servers')}: commit unanswered")
    finally:
        consumer.close()
    error, tps = results[0]
    errors = [error, *(tp.error for tp in tps)]
    for found in errors:
        if refused(found):
            raise refusal(name, config, found)
    failed = [e for e in errors if e is not None]
    if failed:
        raise KafkaUnavailableError(f"Kafka broker {config.get('bootstrap.servers')}: commit: {shorten(failed[0])}")


def committed(
    config: Mapping[str, str], group: str, tps: Sequence[TopicPartition], name: str = "?"
) -> dict[TopicPartition, int]:
    """What consumer group ``group`` has committed for ``tps`` (partitions without a commit left out)."""
    from confluent_kafka import TopicPartition as KafkaPartition

    consumer, refusals = watched_consumer(config, group)
    try:
        asked = [KafkaPartition(t, p) for t, p in tps]
        got = first_contact(consumer, refusals, name, config, lambda t: consumer.committed(asked, timeout=t))
    finally:
        consumer.close()
    return {(tp.topic, tp.partition): int(tp.offset) for tp in got if tp.offset >= 0}
