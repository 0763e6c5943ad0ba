"""Checkpoint storage: the job directory layout and atomic operations over fsspec."""

from airflow_provider_checkpoint.storage.job_storage import (
    CheckpointStorageError,
    JobStorage,
    LeaseHeld,
    Location,
)

__all__ = ["CheckpointStorageError", "JobStorage", "LeaseHeld", "Location"]
