"""How rows are assigned to event-time windows: tumbling, sliding and session windows (pure Python,
validated when the pipeline is declared)."""

from __future__ import annotations

from dataclasses import dataclass

from airflow_provider_checkpoint.core.event_time import duration_ms
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError


@dataclass(frozen=True)
class Windows:
    """How rows are assigned to windows: ``size_ms`` and ``slide_ms`` (tumbling: equal), or ``gap_ms`` (sessions)."""

    kind: str
    size_ms: int = 0
    slide_ms: int = 0
    gap_ms: int = 0

    def describe(self) -> str:
        if self.kind == "session":
            return f"session(gap={self.gap_ms} ms)"
        return f"{self.kind}(size={self.size_ms} ms, slide={self.slide_ms} ms)"


def tumbling(size: str) -> Windows:
    """Fixed, non-overlapping windows ``[k * size, (k + 1) * size)`` (Spark's ``window(ts, size)``)."""
    ms = duration_ms(size, "tumbling window size")
    _positive(ms, "tumbling window size")
    return Windows("tumbling", ms, ms)


def sliding(size: str, slide: str) -> Windows:
    """Windows ``[k * slide, k * slide + size)``; a row is in every one that holds its event time
    (Spark's ``window(ts, size, slide)``, Flink's sliding event-time windows)."""
    ms, every = duration_ms(size, "sliding window size"), duration_ms(slide, "sliding window slide")
    _positive(ms, "sliding window size")
    _positive(every, "sliding window slide")
    if every > ms:
        raise PipelineDefinitionError(f"sliding window: slide {slide!r} must not exceed size {size!r}")
    return Windows("sliding", ms, every)


def session(gap: str) -> Windows:
    """A row opens ``[ts, ts + gap)``; windows of one key that overlap or touch merge into one
    (Spark's ``session_window(ts, gap)``, Flink's event-time session windows)."""
    ms = duration_ms(gap, "session gap")
    _positive(ms, "session gap")
    return Windows("session", gap_ms=ms)


def _positive(ms: int, what: str) -> None:
    if ms <= 0:
        raise PipelineDefinitionError(f"{what} must be positive")
