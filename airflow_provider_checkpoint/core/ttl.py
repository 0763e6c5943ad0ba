"""State that expires: the rules of ``ttl=`` (Flink's ``StateTtlConfig``) and ``within=`` (Spark's
``dropDuplicatesWithinWatermark``), in plain Python.

Every kept key carries its expiry time (ms since the epoch) in its state row, as the hidden column
:data:`EXPIRES_AT`: a restore, a replay and a rescale see the same expiry as the key's other state.
A checkpoint judges expiry by one clock, read from what it already has, so retries stay identical:

- ``time="processing"``: the checkpoint's trigger time (the barrier's), before and after;
- ``time="event"``: the watermark — the restore point's while the checkpoint's rows are merged
  (:attr:`Clocks.read`), the one the checkpoint reaches when it decides what it keeps
  (:attr:`Clocks.keep`); no watermark yet: nothing has expired.

A key's state is *live* while ``clock < expires_at`` (expired at ``expires_at <= clock``, the test
windows and Spark's eviction use). Expired state is never read back: a key with new rows whose
state expired starts from empty. State still expired when the checkpoint ends is not kept: the
checkpoint removes its row, and the next compaction of its key-group range drops it from the files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow_provider_checkpoint.core.event_time import WatermarkProgress, duration_ms
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

EXPIRES_AT = "__expires_at"
"""The hidden state column holding a key's expiry time (ms since the epoch, a long)."""
TIMES = ("processing", "event")
UPDATES = ("on_write", "on_read_and_write")


@dataclass(frozen=True)
class Ttl:
    """``ttl="1 day", ttl_time=..., ttl_update=...`` of an operator.

    ``time="processing"`` (default): a key expires ``ttl_ms`` after the trigger time of the last
    checkpoint that updated it; ``time="event"``: once the watermark passes the greatest event time
    of its rows plus ``ttl_ms`` (the operator then needs ``watermark=``). ``update``: which accesses
    renew the expiry — ``on_write`` (default, Flink's ``OnCreateAndWrite``) or ``on_read_and_write``
    (Flink's ``OnReadAndWrite``). A keyed aggregate reads a key's state only to write it, so there
    both give the same expiry.
    """

    ttl_ms: int
    time: str = "processing"
    update: str = "on_write"

    @classmethod
    def of(cls, value: Any, what: str, time: Any = "processing", update: Any = "on_write") -> Ttl:
        """The :class:`Ttl` of a duration string, a time and an update type; errors name ``what``."""
        ms = duration_ms(value, f"{what} ttl")
        if ms <= 0:
            raise PipelineDefinitionError(f"{what}: ttl must be positive, got {value!r}")
        if time not in TIMES:
            raise PipelineDefinitionError(f"{what}: ttl_time must be one of {', '.join(TIMES)}, got {time!r}")
        if update not in UPDATES:
            raise PipelineDefinitionError(f"{what}: ttl_update must be one of {', '.join(UPDATES)}, got {update!r}")
        return cls(ms, time, update)

    def describe(self) -> dict[str, object]:
        return {"ttl_ms": self.ttl_ms, "time": self.time, "update": self.update}


@dataclass(frozen=True)
class Clocks:
    """The clock (ms) a checkpoint reads state by (:attr:`read`) and keeps state by (:attr:`keep`);
    ``None``: no time yet (no watermark), nothing expires."""

    read: int | None
    keep: int | None

    @classmethod
    def processing(cls, trigger_time: float) -> Clocks:
        """Both clocks are the checkpoint's trigger time (seconds, as the barrier has it)."""
        ms = int(round(trigger_time * 1000))
        return cls(ms, ms)

    @classmethod
    def event(cls, before: WatermarkProgress, after: WatermarkProgress) -> Clocks:
        """Rows are merged at the restore point's watermark, state kept by the one reached."""
        return cls(before.watermark, after.watermark)


def live(expires_at: int | None, clock: int | None) -> bool:
    """Whether state expiring at ``expires_at`` may be read at ``clock`` (``None``: never expires / no time yet)."""
    return expires_at is None or clock is None or clock < expires_at


def renewed(expires_at: int | None, stamp: int, ttl_ms: int) -> int:
    """The expiry of state last expiring at ``expires_at`` (``None``: new or expired) updated at ``stamp``:
    ``stamp + ttl_ms``, never earlier than it was (an out-of-order row does not shorten a key's life)."""
    return stamp + ttl_ms if expires_at is None else max(expires_at, stamp + ttl_ms)
