"""Which completed checkpoints to keep, and which of their files may be deleted."""

from __future__ import annotations

from collections.abc import Sequence

from airflow_provider_checkpoint.core.model import CompletedCheckpoint


def subsumed(completed: Sequence[CompletedCheckpoint], retained: int) -> list[CompletedCheckpoint]:
    """The checkpoints retention discards: all but the ``retained`` newest; never savepoints.

    A savepoint is the self-contained (relocatable) copy; the ``chk-<id>`` a savepoint run
    leaves in the job directory is ordinary history and is retained like any checkpoint.
    """
    if retained < 1:
        raise ValueError(f"retained_checkpoints must be at least 1, got {retained}")
    checkpoints = sorted((c for c in completed if not c.relocatable), key=lambda c: c.checkpoint_id)
    return checkpoints[:-retained] if len(checkpoints) > retained else []


def deletable_paths(discarded: Sequence[CompletedCheckpoint], kept: Sequence[CompletedCheckpoint]) -> set[str]:
    """State files of ``discarded`` that no ``kept`` checkpoint references (shared files stay)."""
    still_needed = set().union(*(c.referenced_paths() for c in kept))
    return set().union(*(c.referenced_paths() for c in discarded)) - still_needed
