"""This repository's Airflow plugins folder: the Checkpoints page (as ``dags/`` is its DAGs folder).

The plugin lives in the package (:mod:`airflow_provider_checkpoint.plugin`), its one
source of truth. An installed package registers it through its ``airflow.plugins`` entry
point, so this file exposes it only when that entry point is absent (the package merely on
``PYTHONPATH``): Airflow would otherwise load it twice and report a duplicate.
"""

from __future__ import annotations

from importlib.metadata import entry_points

if not any(ep.value.startswith("airflow_provider_checkpoint.") for ep in entry_points(group="airflow.plugins")):
    from airflow_provider_checkpoint.plugin import CheckpointsPlugin

    __all__ = ["CheckpointsPlugin"]
