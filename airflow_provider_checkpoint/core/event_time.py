"""Event time: durations, and the watermark a checkpoint reaches (bounded out-of-orderness).

Times are integers in milliseconds since the epoch (UTC). The rule, per operator input:

- ``max_event_time`` after checkpoint N is the greatest event time of any row read up to and
  including N (rows dropped as late included), ``None`` before the first row;
- the watermark after N is ``max(watermark after N-1, max_event_time - bound)``: it never moves
  back, and a checkpoint without rows keeps it;
- rows of checkpoint N are judged late against the watermark of N-1 (the restore point's), and
  the windows the watermark of N closes are emitted by N itself.

So one checkpoint does what a Spark micro-batch and the no-data batch after it do: Spark judges
batch N's rows against the watermark computed after batch N-1 too, but emits what batch N's own
rows close only in the next batch. The watermark is stored in the operator's snapshot
(:class:`WatermarkProgress`), so a restore, a savepoint and a replay see the same one, and it is
not keyed: rescaling keeps it as it is.

An operator with several event-time inputs (:func:`combine`) keeps that progress per input and
a combined watermark: the minimum of the inputs' watermarks, over the inputs that are not
**idle**. With ``idle_after`` set, an input without rows for ``idle_after`` of barrier time
(the checkpoint's trigger time is the clock, so a retry decides the same) is left out of the
minimum until it has rows again; the combined watermark never moves back, so an input that
returns behind it holds it only until it catches up (Flink's ``withIdleness``). An input that
has never had a row holds the combined watermark (none) until it is idle; when every input is
idle, the watermark holds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from airflow_provider_checkpoint.core.documents import Fields, JsonDict
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

_DURATION = re.compile(r"^\s*(\d{1,12})\s*([a-z]+)\s*$", re.I)
_UNITS = {
    **dict.fromkeys(("ms", "millisecond", "milliseconds"), 1),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1000),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60_000),
    **dict.fromkeys(("h", "hour", "hours"), 3_600_000),
    **dict.fromkeys(("d", "day", "days"), 86_400_000),
}
MAX_EVENT_TIME = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z: the greatest event time a snapshot may record (ms)."""


def duration_ms(value: str, what: str) -> int:
    """``"10 minutes"``, ``"30s"``, ``"1 hour"``, ``"250 ms"`` as milliseconds; ``what`` names the
    parameter in the error."""
    m = _DURATION.match(value) if isinstance(value, str) else None
    if not m or m.group(2).lower() not in _UNITS:
        raise PipelineDefinitionError(
            f"{what}: {value!r} is not a duration; write a whole number and a unit, e.g. '10 minutes', "
            "'30 seconds', '1 hour', '500 ms'"
        )
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


@dataclass(frozen=True)
class WatermarkSpec:
    """``watermark=("ts", "10 minutes")``: event time in column ``column``, rows at most ``bound_ms`` out of order."""

    column: str
    bound_ms: int

    @classmethod
    def of(cls, value: Any, what: str) -> WatermarkSpec:
        if not (isinstance(value, tuple | list) and len(value) == 2 and isinstance(value[0], str) and value[0]):
            raise PipelineDefinitionError(
                f"{what}: watermark must be (column, bound), e.g. ('ts', '10 minutes'); got {value!r}"
            )
        return cls(value[0], duration_ms(value[1], f"{what} watermark bound"))


def _times(f: Fields, paired: bool = True) -> tuple[int | None, int | None]:
    """``max_event_time`` and ``watermark`` of a stored progress, checked together; not ``paired`` (several
    inputs), a watermark may still be missing once rows were read."""
    top = f.integer("max_event_time", -MAX_EVENT_TIME, MAX_EVENT_TIME, default=None)
    mark = f.integer("watermark", -2 * MAX_EVENT_TIME, MAX_EVENT_TIME, default=None)
    if (top is None and mark is not None) or (paired and top is not None and mark is None):
        raise f.error("watermark", "must be given exactly when max_event_time is", mark)
    if top is not None and mark is not None and mark > top:
        raise f.error("watermark", f"cannot be after max_event_time {top}", mark)
    return top, mark


@dataclass(frozen=True)
class InputProgress:
    """One input's part of :class:`WatermarkProgress`: its greatest event time and watermark (ms,
    ``None`` before its first row), and ``active_at``: the barrier time (ms) of the last checkpoint
    that gave it rows, or of the first that saw it (the idle rule's clock)."""

    max_event_time: int | None
    watermark: int | None
    active_at: int

    def to_dict(self) -> JsonDict:
        return {"max_event_time": self.max_event_time, "watermark": self.watermark, "active_at": self.active_at}

    @classmethod
    def from_dict(cls, d: Any, document: str, where: str) -> InputProgress:
        f = Fields(d, document, where)
        return cls(*_times(f), f.integer("active_at", 0, MAX_EVENT_TIME))


@dataclass(frozen=True)
class WatermarkProgress:
    """What an operator's snapshot records about event time: the greatest event time read so far
    and the watermark reached (both ms, ``None`` before the first row); with several inputs, each
    input's own progress by uid (:func:`combine`)."""

    max_event_time: int | None = None
    watermark: int | None = None
    inputs: tuple[tuple[str, InputProgress], ...] = ()

    def advance(self, seen: int | None, bound_ms: int) -> WatermarkProgress:
        """After a checkpoint whose rows' greatest event time is ``seen`` (``None``: no rows)."""
        if seen is None:
            return self
        top = seen if self.max_event_time is None else max(self.max_event_time, seen)
        mark = top - bound_ms if self.watermark is None else max(self.watermark, top - bound_ms)
        return replace(self, max_event_time=top, watermark=mark)

    def closes(self, end_ms: int) -> bool:
        """Whether this watermark has passed a time: ``end_ms <= watermark`` (Spark's and Flink's test)."""
        return self.watermark is not None and end_ms <= self.watermark

    def of_input(self, uid: str) -> InputProgress | None:
        return dict(self.inputs).get(uid)

    def to_dict(self) -> JsonDict:
        d: JsonDict = {"max_event_time": self.max_event_time, "watermark": self.watermark}
        if self.inputs:
            d["inputs"] = {uid: p.to_dict() for uid, p in self.inputs}
        return d

    @classmethod
    def from_dict(cls, d: Any, document: str, where: str) -> WatermarkProgress:
        f = Fields(d, document, where)
        top, mark = _times(f, paired=not f.has("inputs"))
        inputs = f.mapping("inputs", lambda v, name: InputProgress.from_dict(v, document, name), default={})
        if len(inputs) > 1000:
            raise f.error("inputs", "must have at most 1000 entries")
        for uid, p in inputs.items():
            if p.max_event_time is not None and (top is None or p.max_event_time > top):
                raise f.error(f"inputs.{uid}.max_event_time", f"cannot be after the operator's max_event_time {top}")
        return cls(top, mark, tuple(sorted(inputs.items())))


def combine(
    before: WatermarkProgress,
    seen: Mapping[str, int | None],
    bounds: Mapping[str, int],
    now_ms: int,
    idle_after_ms: int | None,
) -> WatermarkProgress:
    """The progress of an operator with several inputs after a checkpoint at barrier time ``now_ms``.

    ``seen``: each input's greatest event time in this checkpoint (``None``: no rows), by uid;
    ``bounds``: each input's bound of out-of-orderness (ms). Each input advances as
    :meth:`WatermarkProgress.advance` does. An input is idle when it had no rows in this checkpoint
    and ``now_ms - active_at >= idle_after_ms`` (never, with ``idle_after_ms`` ``None``). The watermark
    is ``max(watermark before, min of the watermarks of the inputs not idle)``; it holds when every
    input is idle or one not idle has no watermark yet. Inputs of ``before`` not in ``seen`` are forgotten.
    """
    progress: dict[str, InputProgress] = {}
    for uid, top in seen.items():
        was = before.of_input(uid) or InputProgress(None, None, now_ms)
        own = WatermarkProgress(was.max_event_time, was.watermark).advance(top, bounds[uid])
        progress[uid] = InputProgress(own.max_event_time, own.watermark, now_ms if top is not None else was.active_at)
    awake = [
        p.watermark
        for uid, p in progress.items()
        if seen[uid] is not None or idle_after_ms is None or now_ms - p.active_at < idle_after_ms
    ]
    mark = before.watermark
    if awake and None not in awake:
        low = min(m for m in awake if m is not None)
        mark = low if mark is None else max(mark, low)
    tops = [p.max_event_time for p in progress.values() if p.max_event_time is not None]
    if before.max_event_time is not None:
        tops.append(before.max_event_time)
    return WatermarkProgress(max(tops) if tops else None, mark, tuple(sorted(progress.items())))
