"""Incremental keyed state: which files make up an operator's state, and when a range is compacted.

An operator's state files are split into key-group ranges, fixed when a full version is
written. Each range has a full version (base files) and, after it, deltas: one file set
per checkpoint that changed keys of the range, holding their new rows or tombstones.
Reading a range takes per key the row of the newest delta holding the key, else the base
row; a tombstone deletes the key. Files are never rewritten: a later checkpoint lists the
files of its restore point it keeps, next to its own, and retention deletes a file only
when no retained checkpoint lists it.

A range is compacted (its merged rows become a new full version, its deltas are dropped)
when its deltas hold more bytes than ``compaction_ratio`` times its full version, or when
it would have more than ``max_deltas`` deltas. To spread that work over checkpoints, a
checkpoint also compacts the single most overdue range once it is ``1 - 1/ranges`` of the
way there (ranges changing at the same pace then fall due one checkpoint apart).
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_provider_checkpoint.state.handles import OperatorSnapshot, StateHandle
from airflow_provider_checkpoint.state.keygroups import index_for_key_group, range_for_index

RANGE_ROWS = 250_000
"""Rows per key-group range of a full version (a range is the unit of compaction)."""
COMPACTION_RATIO = 1.0
MAX_DELTAS = 10
"""Deltas a range keeps at most (Structured Streaming's ``minDeltasForSnapshot`` is 10 too): a restore
reads each, one request per file on an object store."""
FULL_VERSION_SHARE = 0.5
"""A checkpoint whose changelog lists every key writes a full version instead of a delta when at
least this share of the keys changed (a delta that large would make its ranges due at once)."""
RELAYOUT_FACTOR = 4
"""A full rewrite with more ranges once the state wants this many times the ranges it has."""


def ranges_for(rows: int, max_parallelism: int) -> int:
    """The number of key-group ranges a full version of ``rows`` rows is written in."""
    return max(1, min(max_parallelism, -(-rows // RANGE_ROWS)))


@dataclass(frozen=True)
class KeyGroupRange:
    """One range of an operator's state: its full version and its deltas, oldest first."""

    key_groups: tuple[int, int]
    base: tuple[StateHandle, ...]
    deltas: tuple[StateHandle, ...]

    @property
    def handles(self) -> tuple[StateHandle, ...]:
        return self.base + self.deltas

    @property
    def delta_count(self) -> int:
        return len({h.delta for h in self.deltas})

    def overdue(self, compaction_ratio: float, max_deltas: int) -> float:
        """How far the range is towards compaction once one more delta is added (1.0: due)."""
        base = sum(h.size for h in self.base)
        deltas = sum(h.size for h in self.deltas)
        by_size = deltas / (compaction_ratio * base) if base else float(bool(deltas))
        return max(by_size, (self.delta_count + 1) / max_deltas)


@dataclass(frozen=True)
class StateLayout:
    """The key-group ranges of an operator's state in files, in key-group order."""

    max_parallelism: int
    ranges: tuple[KeyGroupRange, ...]

    @classmethod
    def of(cls, snapshot: OperatorSnapshot) -> StateLayout | None:
        """The layout of ``snapshot``, or ``None`` when it cannot be continued incrementally.

        Continuable: state in files whose key-group ranges are exactly the ranges of some
        parallelism (as a full version writes them), every delta within one range.
        """
        if snapshot.inline is not None or not snapshot.handles:
            return None
        if any(h.key_groups is None for h in snapshot.handles):
            return None
        spans = sorted({h.key_groups for h in snapshot.handles if h.key_groups is not None})
        parallelism = _parallelism(snapshot.max_parallelism, spans)
        if parallelism is None:
            return None
        ranges = []
        for i in range(parallelism):
            span = range_for_index(snapshot.max_parallelism, parallelism, i)
            own = [h for h in snapshot.handles if h.key_groups == span]
            deltas = sorted((h for h in own if h.delta is not None), key=lambda h: (h.delta or 0, h.path))
            ranges.append(KeyGroupRange(span, tuple(h for h in own if h.delta is None), tuple(deltas)))
        return cls(snapshot.max_parallelism, tuple(ranges))

    @classmethod
    def empty(cls, max_parallelism: int, parallelism: int) -> StateLayout:
        """``parallelism`` ranges without a file: a first state, written range by range."""
        spans = (range_for_index(max_parallelism, parallelism, i) for i in range(parallelism))
        return cls(max_parallelism, tuple(KeyGroupRange(span, (), ()) for span in spans))

    @property
    def parallelism(self) -> int:
        return len(self.ranges)

    @property
    def has_deltas(self) -> bool:
        """Whether any range has a delta: the recent checkpoints changed few enough keys."""
        return any(r.deltas for r in self.ranges)

    def wants_more_ranges(self, rows: int) -> bool:
        """True when the state has grown to :data:`RELAYOUT_FACTOR` times the ranges it has: only a
        full version rewritten in more ranges continues it."""
        return ranges_for(rows, self.max_parallelism) >= self.parallelism * RELAYOUT_FACTOR

    def due_for_full_version(self, rows: int) -> bool:
        """True when a full version written by Spark is the cheaper way on: every range is due for
        compaction (e.g. most keys change every checkpoint), or :meth:`wants_more_ranges`."""
        return self.wants_more_ranges(rows) or len(self.to_compact()) == self.parallelism

    def to_compact(self, compaction_ratio: float | None = None, max_deltas: int | None = None) -> list[int]:
        """Indexes of the ranges this checkpoint compacts: every due one, and the most overdue
        one once it is ``1 - 1/ranges`` of the way (so compactions spread over checkpoints).
        The bounds default to :data:`COMPACTION_RATIO` and :data:`MAX_DELTAS`."""
        ratio = COMPACTION_RATIO if compaction_ratio is None else compaction_ratio
        overdue = [r.overdue(ratio, MAX_DELTAS if max_deltas is None else max_deltas) for r in self.ranges]
        chosen = {i for i, o in enumerate(overdue) if o >= 1.0}
        worst = max(range(len(overdue)), key=lambda i: overdue[i])
        if self.parallelism > 1 and overdue[worst] >= max(0.5, 1 - 1 / self.parallelism):
            chosen.add(worst)
        return sorted(chosen)

    def handles_after(
        self, written: dict[int, list[StateHandle]], compacted: dict[int, list[StateHandle]]
    ) -> tuple[StateHandle, ...]:
        """Every file of the next snapshot: kept files plus new deltas (``written``), or a
        range's new full version (``compacted``), by range index."""
        handles: list[StateHandle] = []
        for i, r in enumerate(self.ranges):
            if i in compacted:
                handles.extend(compacted[i])
            else:
                handles.extend(r.handles)
                handles.extend(written.get(i, []))
        return tuple(handles)


def _parallelism(max_parallelism: int, spans: list[tuple[int, int]]) -> int | None:
    """The fewest ranges whose key-group ranges include every one of ``spans`` (a range
    without rows has no file), or ``None`` if no parallelism fits."""
    for parallelism in range(max(1, len(spans)), max_parallelism + 1):
        if all(
            range_for_index(max_parallelism, parallelism, index_for_key_group(max_parallelism, parallelism, lo))
            == (lo, hi)
            for lo, hi in spans
        ):
            return parallelism
    return None


def merge_order(handles: tuple[StateHandle, ...]) -> tuple[list[StateHandle], list[tuple[int, list[StateHandle]]]]:
    """Full-version files, and the delta files grouped by their checkpoint, oldest first."""
    base = [h for h in handles if h.delta is None]
    by_checkpoint: dict[int, list[StateHandle]] = {}
    for h in handles:
        if h.delta is not None:
            by_checkpoint.setdefault(h.delta, []).append(h)
    return base, sorted(by_checkpoint.items())
