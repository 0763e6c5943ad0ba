"""Kafka positions: the offsets a barrier cuts, validated, bounded and split for reading (pure Python).

A position is ``{"offsets": {topic: {partition: next offset}}, "starts": {...}}``: ``offsets``
holds, for every partition the source has seen, the first offset *not* yet read (the barrier
is the partitions' end offsets at trigger time); ``starts`` holds, for a partition first seen
at this barrier, the offset its reading starts from (earliest, latest or a timestamp's
offset, decided once by the trigger so that every attempt of the step reads the same range), and
for a partition whose topic was recreated since the previous barrier, the new topic's first
offset; ``ids`` holds each topic's id where the broker gives one (a recreated topic gets a new
one). Stored positions are untrusted: :meth:`Offsets.parse` checks every name and number.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_checkpoint.exceptions import InvalidPositionError

TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
TOPIC_ID = re.compile(r"^[A-Za-z0-9_=+/-]{1,64}$")
"""A topic id as the client prints it (base64 of a UUID)."""
"""A legal Kafka topic name."""
MAX_OFFSET = 2**63 - 1
MAX_PARTITIONS = 1_000_000

TopicPartition = tuple[str, int]


def _offsets(value: Any, what: str) -> dict[TopicPartition, int]:
    if not isinstance(value, dict):
        raise InvalidPositionError(f"{what} must be an object of topics, got {type(value).__name__}")
    out: dict[TopicPartition, int] = {}
    for topic, partitions in value.items():
        if not isinstance(topic, str) or not TOPIC.match(topic) or topic in (".", ".."):
            raise InvalidPositionError(f"{what}: {topic!r} is not a Kafka topic name")
        if not isinstance(partitions, dict):
            raise InvalidPositionError(f"{what}[{topic}] must be an object of partitions")
        for partition, offset in partitions.items():
            if not (isinstance(partition, str) and partition.isdigit() and partition == str(int(partition))):
                raise InvalidPositionError(f"{what}[{topic}]: partition {partition!r} is not a partition number")
            if int(partition) >= MAX_PARTITIONS:
                raise InvalidPositionError(f"{what}[{topic}]: partition {partition} is out of range")
            if type(offset) is not int or not 0 <= offset <= MAX_OFFSET:
                raise InvalidPositionError(f"{what}[{topic}][{partition}]: offset {offset!r} is not an offset")
            out[(topic, int(partition))] = offset
    return out


def _document(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


@dataclass(frozen=True)
class Offsets:
    """A Kafka source's position (see the module docstring)."""

    offsets: dict[TopicPartition, int] = field(default_factory=dict)
    starts: dict[TopicPartition, int] = field(default_factory=dict)
    ids: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, value: Any, what: str = "Kafka position") -> Offsets:
        """The position ``value`` (a stored document, untrusted); ``None`` is the empty position."""
        if value is None:
            return cls()
        if not isinstance(value, dict) or set(value) - {"offsets", "starts", "ids"}:
            raise InvalidPositionError(f"{what} must be an object with 'offsets' (and 'starts'), got {value!r:.200}")
        offsets = _offsets(value.get("offsets", {}), f"{what}.offsets")
        starts = _offsets(value.get("starts", {}), f"{what}.starts")
        for tp, start in starts.items():
            if tp not in offsets or start > offsets[tp]:
                raise InvalidPositionError(f"{what}: {tp[0]}[{tp[1]}] starts at {start} past its end offset")
        ids = value.get("ids", {})
        if not isinstance(ids, dict) or not all(
            isinstance(t, str) and TOPIC.match(t) and isinstance(i, str) and TOPIC_ID.match(i) for t, i in ids.items()
        ):
            raise InvalidPositionError(f"{what}.ids must map topic names to topic ids, got {ids!r:.200}")
        return cls(offsets, starts, dict(ids))

    def to_json(self) -> dict[str, Any]:
        document = {"offsets": _document(self.offsets), "starts": _document(self.starts)}
        return {**document, "ids": dict(sorted(self.ids.items()))} if self.ids else document

    def start_of(self, tp: TopicPartition, previous: Offsets) -> int:
        """Where this barrier's range of ``tp`` starts: this barrier's start (a partition first seen, or
        its topic recreated), else the previous end."""
        return self.starts.get(tp, previous.offsets.get(tp, self.offsets[tp]))

    def reset(self, previous: Offsets) -> list[tuple[TopicPartition, int, int]]:
        """``(partition, previous end, new start)`` of every partition read again from a new start: its
        topic was recreated since ``previous`` (see :meth:`KafkaSource.barrier_position`)."""
        return [
            (tp, previous.offsets[tp], start) for tp, start in sorted(self.starts.items()) if tp in previous.offsets
        ]

    def ranges(self, previous: Offsets) -> Iterator[tuple[TopicPartition, int, int]]:
        """``(partition, start, end)`` of every partition with records in ``[previous, self)``; a
        barrier behind its previous position is refused (a forged position)."""
        for tp, end in sorted(self.offsets.items()):
            start = self.start_of(tp, previous)
            if end < start:
                raise InvalidPositionError(f"{tp[0]}[{tp[1]}]: the barrier's end offset {end} is before {start}")
            if end > start:
                yield tp, start, end


def bounded(
    starts: Mapping[TopicPartition, int], ends: Mapping[TopicPartition, int], limit: int | None
) -> dict[TopicPartition, int]:
    """``ends`` cut so that at most ``limit`` records lie in ``[starts, ends)`` over all partitions.

    Each partition gets a share proportional to its backlog (as Structured Streaming's
    ``maxOffsetsPerTrigger``), rounded down, the remainder to the largest backlogs first; a
    partition with a backlog is never starved for good: any backlog gets at least one record
    while the limit allows it.
    """
    backlog = {tp: max(0, ends[tp] - starts.get(tp, ends[tp])) for tp in ends}
    total = sum(backlog.values())
    if limit is None or total <= limit:
        return dict(ends)
    waiting = [tp for tp, n in backlog.items() if n]
    share = {tp: 0 for tp in backlog}
    if limit >= len(waiting):  # one record each first: no backlog waits for good
        share.update(dict.fromkeys(waiting, 1))
    left = limit - sum(share.values())
    rest = {tp: backlog[tp] - share[tp] for tp in backlog}
    total = sum(rest.values())
    for tp in backlog:
        share[tp] += rest[tp] * left // total if total else 0
    left = limit - sum(share.values())
    for tp in sorted(backlog, key=lambda t: (-(backlog[t] - share[t]), t)):
        if left <= 0:
            break
        if backlog[tp] > share[tp]:
            share[tp] += 1
            left -= 1
    return {tp: starts.get(tp, ends[tp]) + share[tp] if backlog[tp] else ends[tp] for tp in ends}


def split(ranges: list[tuple[TopicPartition, int, int]], tasks: int) -> list[tuple[str, int, int, int]]:
    """``ranges`` cut into about ``tasks`` pieces of similar size, in (topic, partition, offset) order:
    ``(topic, partition, start, end)``. A range is split only when it holds more than its share."""
    total = sum(end - start for _, start, end in ranges)
    if not total:
        return []
    size = max(1, -(-total // max(1, tasks)))
    out = []
    for (topic, partition), start, end in ranges:
        at = start
        while at < end:
            out.append((topic, partition, at, min(end, at + size)))
            at += size
    return out
