"""A job's checkpointing configuration (Flink's Configuration tab): the settings its last trigger ran
with (recorded in its registry entry), the schedule and chaining Airflow knows of its DAG, and its
steps, sinks and sources (the topology in ``_job.json``).

Why recorded settings rather than the DAG file: the API server and the CLI never run pipeline code
(the DAG file may need packages, connections or Spark they do not have, and parsing it is slow);
the settings the trigger recorded are those the running job uses. Every recorded value is
type-checked: malformed is ``None``.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_checkpoint.core.documents import JsonDict
from airflow_provider_checkpoint.jobs import values
from airflow_provider_checkpoint.jobs.runs import DagFacts


def nodes_of_kind(topology: Any, kind: str) -> list[str]:
    nodes = values.mapping(values.mapping(topology).get("nodes"))
    return sorted(uid for uid, node in nodes.items() if values.name(uid) and values.mapping(node).get("kind") == kind)


def configuration(settings: Any, topology: Any, storage_url: str, dag: DagFacts) -> JsonDict:
    """The configuration from recorded ``settings`` (the fields of
    :class:`~airflow_provider_checkpoint.core.settings.CheckpointSettings`), the job's ``topology``
    and what Airflow knows of its DAG."""
    s = values.mapping(settings)
    kind = s.get("checkpoint_storage")
    steps = values.mapping(topology).get("steps")
    return {
        "schedule": dag.schedule,
        "checkpoint_timeout_seconds": values.number(s.get("checkpoint_timeout_seconds")),
        "min_pause_seconds": values.number(s.get("min_pause_between_checkpoints_seconds")),
        "tolerable_failed_checkpoints": values.count(s.get("tolerable_failed_checkpoints")),
        "retained_checkpoints": values.positive(s.get("retained_checkpoints")),
        "storage": storage_url,
        "checkpoint_storage": kind if kind in ("filesystem", "memory") else None,
        "inline_state_threshold": values.count(s.get("inline_state_threshold")),
        "incremental_state": values.flag(s.get("incremental_state")),
        "chain": dag.chained,
        "steps": [n for n in (steps if isinstance(steps, dict) else {}) if values.name(n)],
        "sinks": nodes_of_kind(topology, "sink"),
        "sources": nodes_of_kind(topology, "source"),
    }
