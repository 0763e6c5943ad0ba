"""Whose state files a step may keep: the restore point's, only when they lie in this job's directory.

A step's state files are its own (written in its attempt directory) or kept from its
restore point (:func:`~airflow_provider_checkpoint.state.handles.stray_handles`).
Keeping is allowed only for a restore point in this job's directory: retention sees every
reference there, while a restore from a savepoint or another job copies its state anew.
"""

from __future__ import annotations

from airflow_provider_checkpoint.core.model import RestorePoint
from airflow_provider_checkpoint.storage import Location


def restore_base(storage: Location, point: RestorePoint | None) -> Location:
    """Where the restore point's state files resolve: its base URL, else this job's directory."""
    return storage.beside(point.base_url) if point is not None and point.base_url else storage


def keeps_files_of(storage: Location, base: Location) -> bool:
    """Whether a step of the job at ``storage`` may keep state files under ``base`` rather than rewrite them."""
    return base.url() == storage.url()


def keeps_restored_files(storage: Location, point: RestorePoint | None) -> bool:
    """Whether the steps of a checkpoint from ``point`` may keep its state files."""
    return point is not None and keeps_files_of(storage, restore_base(storage, point))
