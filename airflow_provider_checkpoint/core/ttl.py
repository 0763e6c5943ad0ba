"""State that expires: the rules of ``ttl=`` (Flink's ``StateTtlConfig``) and ``within=`` (Spark's
``dropDuplicatesWithinWatermark``), in plain Python.

Every kept key carries its expiry time (ms since the epoch) in its state row, as the hidden column
:data:`EXPIRES_AT`: a restore, a replay and a rescale see the same expiry as the key's other state.
A checkpoint judges expiry by one clock, read from what it already has, so retries stay identical:

- ``time="processing"``: the checkpoint's trigger time (the barrier's), before and after;
- ``time="event"``: the watermark — the restore point's while the checkpoint's rows are merged
  (:meth:`Clocks.read`), the one the checkpoint reaches when it decides what it keeps
  (:meth:`Clocks.keep`); no watermark yet: nothing has expired.

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
class TTL:
    """How long state lives: ``TTL("1 day")``, ``TTL("1 day", time="event", update="on_read_and_write")``;
    wherever ``ttl=`` is taken, ``ttl="1 day"`` is ``TTL("1 day")``.

    ``time="processing"`` (default): state expires ``duration`` after the trigger time of the last
    checkpoint that updated it; ``time="event"``: once the watermark passes the time it was updated
    at (the event time of its rows, or the watermark) plus ``duration`` (the operator then needs a
    watermark). ``update``: which accesses renew the expiry — ``on_write`` (default, Flink's
    ``OnCreateAndWrite``) or ``on_read_and_write`` (Flink's ``OnReadAndWrite``).
    """

    duration: str
    time: str = "processing"
    update: str = "on_write"

    @classmethod
    def of(cls, value: Any, what: str) -> TTL:
        """``value`` (a :class:`TTL` or a duration string) checked; errors name ``what``."""
        ttl = cls(value) if isinstance(value, str) else value
        if not isinstance(ttl, TTL):
            raise PipelineDefinitionError(
                f"{what}: ttl must be a duration such as '1 day' or a TTL('1 day', time=..., update=...), got {value!r}"
            )
        if ttl.time not in TIMES:
            raise PipelineDefinitionError(f"{what}: TTL time must be one of {', '.join(TIMES)}, got {ttl.time!r}")
        if ttl.update not in UPDATES:
            raise PipelineDefinitionError(f"{what}: TTL update must be one of {', '.join(UPDATES)}, got {ttl.update!r}")
        if duration_ms(ttl.duration, f"{what} ttl") <= 0:
            raise PipelineDefinitionError(f"{what}: ttl must be positive, got {ttl.duration!r}")
        return ttl

    @property
    def ms(self) -> int:
        """The duration in ms (of a TTL checked by :meth:`of`)."""
        return duration_ms(self.duration, "ttl")

    def describe(self) -> dict[str, object]:
        return {"ttl_ms": self.ms, "time": self.time, "update": self.update}


@dataclass(frozen=True)
class Clocks:
    """The clocks of one checkpoint (ms): the watermark before it (:attr:`before`) and the one it reaches
    (:attr:`after`), ``None`` while there is none, and its trigger time (:attr:`processing`, the
    barrier's). State with a TTL by ``time`` is read by :meth:`read` and kept by :meth:`keep`."""

    before: int | None
    after: int | None
    processing: int

    @classmethod
    def of_checkpoint(
        cls, trigger_time: float, before: WatermarkProgress | None = None, after: WatermarkProgress | None = None
    ) -> Clocks:
        """From the barrier's trigger time (seconds) and, with event time, the watermarks before and after."""
        return cls(
            before.watermark if before else None, after.watermark if after else None, int(round(trigger_time * 1000))
        )

    def read(self, time: str) -> int | None:
        """The clock state is read by while rows are merged: the restore point's watermark, or the trigger time."""
        return self.before if time == "event" else self.processing

    def keep(self, time: str) -> int | None:
        """The clock that decides what the checkpoint keeps: the watermark reached, or the trigger time."""
        return self.after if time == "event" else self.processing


def live(expires_at: int | None, clock: int | None) -> bool:
    """Whether state expiring at ``expires_at`` may be read at ``clock`` (``None``: never expires / no time yet)."""
    return expires_at is None or clock is None or clock < expires_at


def renewed(expires_at: int | None, stamp: int, ttl_ms: int) -> int:
    """The expiry of state last expiring at ``expires_at`` (``None``: new or expired) updated at ``stamp``:
    ``stamp + ttl_ms``, never earlier than it was (an out-of-order row does not shorten a key's life)."""
    return stamp + ttl_ms if expires_at is None else max(expires_at, stamp + ttl_ms)
