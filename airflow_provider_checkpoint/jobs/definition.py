"""A checkpointed job as the Airflow operators see it: graph, storage and settings."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from airflow_provider_checkpoint.coordinator import CheckpointCoordinator
from airflow_provider_checkpoint.core.settings import CheckpointSettings
from airflow_provider_checkpoint.dataflow.planner import PipelineGraph
from airflow_provider_checkpoint.metrics import CheckpointMetrics
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.storage.config import allowed_roots, config_value, job_storage


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
    check_versions: bool = True
    """The trigger runs the pipeline check once per version of the pipeline's definition (:mod:`.check`)."""

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
            self.storage(),
            self.graph,
            self.resolved_settings(),
            self.dag_id,
            allowed_roots(self.storage_root),
            CheckpointMetrics(self.job_id, self.graph.sources),
        )
