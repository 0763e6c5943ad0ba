"""Provider metadata, registered through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from typing import Any


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-provider-checkpoint",
        "name": "Checkpoint",
        "description": "Exactly-once, stateful Spark pipelines with Apache Flink's checkpoint and "
        "savepoint guarantees: every DAG run is a checkpoint.",
        "versions": ["0.1.0"],
        "integrations": [
            {
                "integration-name": "Checkpoint",
                "external-doc-url": "https://pypi.org/project/airflow-provider-checkpoint/",
                "tags": ["software"],
            }
        ],
        "operators": [
            {
                "integration-name": "Checkpoint",
                "python-modules": [
                    "airflow_provider_checkpoint.operators.checkpoint",
                    "airflow_provider_checkpoint.operators.chained",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": "Checkpoint",
                "python-modules": ["airflow_provider_checkpoint.sensors.checkpoint"],
            }
        ],
        "triggers": [
            {
                "integration-name": "Checkpoint",
                "python-modules": ["airflow_provider_checkpoint.triggers.checkpoint"],
            }
        ],
        "hooks": [
            {
                "integration-name": "Checkpoint",
                "python-modules": ["airflow_provider_checkpoint.hooks.checkpoint"],
            }
        ],
        "plugins": [{"name": "checkpoints", "plugin-class": "airflow_provider_checkpoint.plugin.CheckpointsPlugin"}],
        "cli": ["airflow_provider_checkpoint.cli.definition.get_cli_commands"],
        "config": {
            "checkpoint": {
                "description": "Checkpoint storage and retention of checkpointed pipelines.",
                "options": {
                    "storage_root": {
                        "description": "URL of the checkpoint storage root; every job keeps its files "
                        "under <storage_root>/<job_id>/. Any fsspec / ObjectStoragePath URL. Empty means "
                        "file://$AIRFLOW_HOME/checkpoints.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "s3://aws_default@bucket/checkpoints",
                        "default": "",
                    },
                    "storage_schemes": {
                        "description": "Comma-separated URL schemes a storage root or savepoint root may "
                        "use besides file, memory and s3/s3a (e.g. gs,abfs). No other scheme is ever "
                        "opened: a registry entry naming one is refused before any connection.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "gs,abfs",
                        "default": "",
                    },
                    "savepoint_roots": {
                        "description": "Comma-separated URLs under which savepoints may be written and "
                        "from which snapshots may be restored. Empty means "
                        "file://$AIRFLOW_HOME/savepoints.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "file:///data/savepoints,s3://aws_default@bucket/savepoints",
                        "default": "",
                    },
                    "spark_conn_id": {
                        "description": "Spark provider connection the steps of every pipeline run through, "
                        "unless a pipeline sets spark_conn_id. Type 'spark': each step is submitted with "
                        "spark-submit (client deploy mode); type 'spark_connect': each step runs on that "
                        "Spark Connect server. Empty means an embedded local[*] session in each step task.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "spark_default",
                        "default": "",
                    },
                    "retained_checkpoints": {
                        "description": "Completed checkpoints kept per job (newest first) when a "
                        "pipeline does not set its own; savepoints are never deleted.",
                        "version_added": "0.1.0",
                        "type": "integer",
                        "example": "3",
                        "default": "3",
                    },
                },
            }
        },
    }
