"""Which completed checkpoints to keep, and which of their files may be deleted."""

from __future__ import annotations

from collections.abc import Sequence

from airflow_provider_checkpoint.core.model import CheckpointType, CompletedCheckpoint


def subsumed(completed: Sequence[CompletedCheckpoint], retained: int) -> list[CompletedCheckpoint]:
    """The checkpoints retention discards: all but the ``retained`` newest; never savepoints."""
    if retained < 1:
        raise ValueError(f"retained_checkpoints must be at least 1, got {retained}")
    checkpoints = sorted((c for c in completed if c.type is CheckpointType.CHECKPOINT), key=lambda c: c.checkpoint_id)
    return checkpoints[:-retained] if len(checkpoints) > retained else []


def deletable_paths(discarded: Sequence[CompletedCheckpoint], kept: Sequence[CompletedCheckpoint]) -> set[str]:
    """State files of ``discarded`` that no ``kept`` checkpoint references (shared files stay)."""
    still_needed = set().union(*(c.referenced_paths() for c in kept))
    return set().union(*(c.referenced_paths() for c in discarded)) - still_needed
