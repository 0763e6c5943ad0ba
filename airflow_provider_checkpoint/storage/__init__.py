"""Checkpoint storage: the job directory layout and atomic operations over fsspec."""

from airflow_provider_checkpoint.storage.job_storage import JobStorage, Location

__all__ = ["JobStorage", "Location"]
