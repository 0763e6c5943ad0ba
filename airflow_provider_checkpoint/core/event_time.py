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
"""

from __future__ import annotations

import re
from dataclasses import dataclass
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


@dataclass(frozen=True)
class WatermarkProgress:
    """What an operator's snapshot records about event time: the greatest event time read so far
    and the watermark reached (both ms, ``None`` before the first row)."""

    max_event_time: int | None = None
    watermark: int | None = None

    def advance(self, seen: int | None, bound_ms: int) -> WatermarkProgress:
        """After a checkpoint whose rows' greatest event time is ``seen`` (``None``: no rows)."""
        if seen is None:
            return self
        top = seen if self.max_event_time is None else max(self.max_event_time, seen)
        mark = top - bound_ms if self.watermark is None else max(self.watermark, top - bound_ms)
        return WatermarkProgress(top, mark)

    def closes(self, end_ms: int) -> bool:
        """Whether this watermark has passed a time: ``end_ms <= watermark`` (Spark's and Flink's test)."""
        return self.watermark is not None and end_ms <= self.watermark

    def to_dict(self) -> JsonDict:
        return {"max_event_time": self.max_event_time, "watermark": self.watermark}

    @classmethod
    def from_dict(cls, d: Any, document: str, where: str) -> WatermarkProgress:
        f = Fields(d, document, where)
        top = f.integer("max_event_time", -MAX_EVENT_TIME, MAX_EVENT_TIME, default=None)
        mark = f.integer("watermark", -2 * MAX_EVENT_TIME, MAX_EVENT_TIME, default=None)
        if (top is None) != (mark is None):
            raise f.error("watermark", "must be given exactly when max_event_time is", mark)
        if top is not None and mark > top:
            raise f.error("watermark", f"cannot be after max_event_time {top}", mark)
        return cls(top, mark)
