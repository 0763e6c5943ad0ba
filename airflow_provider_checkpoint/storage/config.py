"""The ``[checkpoint]`` section of Airflow's configuration and the storage it names.

Storage root, savepoint roots, the roots UI-given paths may point under, and a job's
:class:`JobStorage` through Airflow's ObjectStoragePath (connections apply).
"""

from __future__ import annotations

import os
from typing import Any

from airflow_provider_checkpoint.exceptions import CheckpointStorageError, shorten
from airflow_provider_checkpoint.storage.job_storage import JobStorage

SECTION = "checkpoint"


def config_value(key: str, fallback: str = "") -> str:
    """A ``[checkpoint]`` option from Airflow's configuration (env ``AIRFLOW__CHECKPOINT__<KEY>``)."""
    from airflow.sdk import conf

    return str(conf.get(SECTION, key, fallback=fallback) or fallback)


def default_storage_root() -> str:
    """``[checkpoint] storage_root``, else ``$AIRFLOW_HOME/checkpoints``."""
    configured = config_value("storage_root")
    if configured:
        return configured
    home = os.environ.get("AIRFLOW_HOME", os.path.expanduser("~/airflow"))
    return f"file://{os.path.abspath(home)}/checkpoints"


def default_savepoint_roots() -> list[str]:
    """``[checkpoint] savepoint_roots`` (comma-separated), else ``$AIRFLOW_HOME/savepoints``."""
    configured = [r.strip() for r in config_value("savepoint_roots").split(",") if r.strip()]
    if configured:
        return configured
    home = os.environ.get("AIRFLOW_HOME", os.path.expanduser("~/airflow"))
    return [f"file://{os.path.abspath(home)}/savepoints"]


def allowed_roots(storage_root: str | None = None) -> list[str]:
    """Where UI-given savepoint and restore paths may point: the savepoint roots and the storage root."""
    return [*default_savepoint_roots(), storage_root or default_storage_root()]


def job_storage(job_id: str, storage_root: str | None = None, conn_id: str | None = None) -> JobStorage:
    """The storage of ``job_id`` through Airflow's ObjectStoragePath (connections apply)."""
    from airflow.sdk import ObjectStoragePath

    url = storage_root or default_storage_root()
    try:
        root = ObjectStoragePath(url, conn_id=conn_id)
    except (ValueError, ImportError) as e:  # unknown scheme, or its filesystem package is missing
        raise CheckpointStorageError(f"no filesystem serves {shorten(url)}: {e}") from e
    path: Any = root.path
    return JobStorage(root.fs, str(path).rstrip("/"), job_id)
