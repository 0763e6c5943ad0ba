"""A checkpointed job as the Airflow operators see it: graph, storage and settings."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_checkpoint.coordinator import CheckpointCoordinator
from airflow_provider_checkpoint.core.documents import shorten
from airflow_provider_checkpoint.core.settings import CheckpointSettings
from airflow_provider_checkpoint.dataflow.graph import PipelineGraph
from airflow_provider_checkpoint.exceptions import CheckpointStorageError
from airflow_provider_checkpoint.storage import JobStorage

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


@dataclass(frozen=True)
class CheckpointJob:
    """Everything needed to run the protocol for one job; built at DAG-parse time, cheaply."""

    job_id: str
    graph: PipelineGraph
    storage_root: str | None = None
    storage_conn_id: str | None = None
    settings: CheckpointSettings | None = None
    spark_conf: dict[str, str] = field(default_factory=dict)
    dag_id: str | None = None
    spark_conn_id: str | None = None
    """A ``spark`` or ``spark_connect`` connection the steps run through (default ``[checkpoint] spark_conn_id``)."""

    def resolved_settings(self) -> CheckpointSettings:
        settings = self.settings or CheckpointSettings()
        if settings.retained_checkpoints is None:
            retained = int(config_value("retained_checkpoints", "3"))
            settings = dataclasses.replace(settings, retained_checkpoints=retained)
        return settings

    def storage(self) -> JobStorage:
        return job_storage(self.job_id, self.storage_root, self.storage_conn_id)

    def coordinator(self) -> CheckpointCoordinator:
        return CheckpointCoordinator(
            self.storage(), self.graph, self.resolved_settings(), self.dag_id, allowed_roots(self.storage_root)
        )
