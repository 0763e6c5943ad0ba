"""The barrier of a Kafka source (the trigger, no Spark): every partition's end offset now, where
partitions first seen start, and topics deleted and recreated since the previous barrier.

A partition first seen — a topic that starts to match, or a partition added to a topic
(``CreatePartitions``) — starts at the job's ``starting_offsets`` at its first barrier, at its
earliest offset after that, so each record of a new partition is read once, from its start (as
Structured Streaming's Kafka source reads partitions discovered while a query runs).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from airflow_provider_checkpoint.connectors.kafka import client
from airflow_provider_checkpoint.connectors.kafka.offsets import Offsets, TopicPartition, bounded
from airflow_provider_checkpoint.connectors.kafka.reader import fetching
from airflow_provider_checkpoint.exceptions import KafkaSourceError

log = logging.getLogger(__name__)


class Watched(Protocol):
    """What the barrier needs of a source (:class:`~.source.KafkaSource` has it)."""

    uid: str
    topics: list[str] | None
    pattern: str | None
    kafka_config_id: str
    starting_offsets: str | int
    max_records_per_checkpoint: int | None
    fail_on_data_loss: bool

    def config(self) -> dict[str, str]: ...


def cut(source: Watched, before: Offsets) -> Offsets:
    """Every partition's end offset now (at most ``max_records_per_checkpoint`` records past ``before``),
    and where partitions first seen now start."""
    with client.Broker(fetching(source.config()), source.kafka_config_id) as broker:
        partitions = broker.partitions(source.topics, source.pattern)
        ids = broker.topic_ids(sorted({t for t, _ in partitions}))
        listed = broker.watermarks(partitions)
        gone = recreated(source, before, partitions, ids, listed)
        known = {tp: o for tp, o in before.offsets.items() if tp[0] not in gone}
        ends = broker.ends(partitions, known, listed)
        new = [tp for tp in partitions if tp not in known]
        starts = _starts(source, broker, new, ends, first=not before.offsets)
    begin = {**{tp: known[tp] for tp in partitions if tp in known}, **starts}
    limit = source.max_records_per_checkpoint
    cut = bounded(begin, {tp: max(ends[tp], begin[tp]) for tp in partitions}, limit)
    if starts and before.offsets:
        log.info("source %s: new partition(s) read from their start: %s", source.uid, _named(starts))
    return Offsets({**known, **cut}, starts, {**before.ids, **ids})


def _named(offsets: dict[TopicPartition, int]) -> str:
    return ", ".join(f"{t}[{p}]@{o}" for (t, p), o in sorted(offsets.items())[:20])


def recreated(
    source: Watched,
    before: Offsets,
    partitions: list[TopicPartition],
    ids: dict[str, str],
    listed: dict[TopicPartition, tuple[int, int]],
) -> dict[str, str]:
    """The topics deleted and recreated since ``before`` (a new topic id, or a partition whose recorded
    offset is past its end or that is gone), each with what showed it. With ``fail_on_data_loss`` any
    is refused; else each is read again from its new beginning (its partitions first seen now)."""
    found: dict[str, str] = {}
    for topic in sorted({t for t, _ in partitions}):
        if before.ids.get(topic) and ids.get(topic) and before.ids[topic] != ids[topic]:
            found[topic] = f"its topic id changed from {before.ids[topic]} to {ids[topic]}"
    for (topic, partition), offset in sorted(before.offsets.items()):
        if topic in found or not any(t == topic for t, _ in partitions):
            continue
        if (topic, partition) not in listed:
            found[topic] = f"partition {partition} (recorded offset {offset}) is gone"
        elif offset > listed[(topic, partition)][1]:
            end = listed[(topic, partition)][1]
            found[topic] = f"partition {partition} went backwards: recorded offset {offset} is past its end {end}"
    if found and source.fail_on_data_loss:
        raise KafkaSourceError(
            f"source {source.uid}: Kafka topic(s) deleted and recreated (or truncated) since the restored "
            f"checkpoint: {'; '.join(f'{t}: {why}' for t, why in found.items())}. The old topic's records "
            "past the checkpoint's offsets are lost and the new topic's offsets mean other records. Nothing "
            "was read or committed. To read the new topic from its beginning, set fail_on_data_loss=False "
            "(the reset is recorded in the checkpoint's stats as source_reset); or restore a checkpoint "
            "taken since the recreation"
        )
    for topic, why in found.items():
        log.warning("source %s: topic %s recreated (%s): read again from its beginning", source.uid, topic, why)
    return found


def _starts(
    source: Watched, broker: client.Broker, new: Sequence[TopicPartition], ends: dict[TopicPartition, int], first: bool
) -> dict[TopicPartition, int]:
    """Where partitions first seen start: ``starting_offsets`` at the job's first barrier, else earliest."""
    if not new:
        return {}
    if first and source.starting_offsets == "latest":
        return {tp: ends[tp] for tp in new}
    if first and isinstance(source.starting_offsets, int):
        return broker.at_time(list(new), source.starting_offsets, ends)
    earliest = broker.earliest(new)
    return {tp: min(earliest[tp], ends[tp]) for tp in new}
