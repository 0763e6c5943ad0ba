"""Checkpointing options of a job (Flink's CheckpointConfig), validated when they are set."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CheckpointSettings:
    """Checkpointing options of a job (Flink's CheckpointConfig)."""

    retained_checkpoints: int | None = None
    """``None``: the Airflow config ``[checkpoint] retained_checkpoints`` (default 3)."""
    checkpoint_timeout_seconds: float = 3600.0
    tolerable_failed_checkpoints: int = 3
    min_pause_between_checkpoints_seconds: float = 0.0
    checkpoint_storage: str = "filesystem"
    """``filesystem``: state in files, small state inline; ``memory``: all state inline (Flink's JobManager storage)."""
    inline_state_threshold: int = 20 << 10
    """State of an operator up to this many bytes (at most 1 MiB) travels inline in the ack and ``_metadata``."""
    max_state_size: int = 5 << 20
    """Memory checkpoint storage declines a checkpoint whose state of one operator exceeds this (at most 64 MiB)."""
    incremental_state: bool = True
    """State in files: a checkpoint writes only the keys that changed (see ``core.incremental``)."""
    driver_merge_rows: int = 5_000_000
    """An incremental checkpoint of an operator with a per-key partial form (``KeyedAggregate``)
    whose state has at most this many rows merges it on the Spark driver with pyarrow: one
    Spark job instead of five to seven (0: always merge in Spark). The driver's peak memory is
    about 160 bytes a state row for four narrow columns (640 MiB at 4,000,000 rows)."""

    def __post_init__(self) -> None:
        if self.checkpoint_storage not in ("filesystem", "memory"):
            raise ValueError(f"checkpoint_storage must be 'filesystem' or 'memory', got {self.checkpoint_storage!r}")
        if not 0 <= self.inline_state_threshold <= 1 << 20:
            raise ValueError(f"inline_state_threshold must be in [0, 1 MiB], got {self.inline_state_threshold}")
        if self.driver_merge_rows < 0:
            raise ValueError(f"driver_merge_rows must be at least 0, got {self.driver_merge_rows}")
        if not 0 < self.max_state_size <= 64 << 20:
            raise ValueError(f"max_state_size must be in (0, 64 MiB], got {self.max_state_size}")

    @property
    def max_inline_state(self) -> int | None:
        """The inline limit of memory checkpoint storage, ``None`` for filesystem storage."""
        return self.max_state_size if self.checkpoint_storage == "memory" else None
