"""The provider as Airflow sees it: registered through the entry point, with its config section."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.airflow


def test_airflow_lists_the_provider_and_its_config(airflow_db):
    listed = subprocess.run(
        [sys.executable, "-m", "airflow", "providers", "list", "--output", "json"],
        check=True,
        capture_output=True,
        text=True,
    )
    providers = {p["package_name"]: p for p in json.loads(listed.stdout)}
    assert providers["airflow-provider-checkpoint"]["version"] == "0.1.0"

    config = subprocess.run(
        [sys.executable, "-m", "airflow", "config", "get-value", "checkpoint", "retained_checkpoints"],
        check=True,
        capture_output=True,
        text=True,
    )
    assert config.stdout.strip() == "3"


def test_airflow_lists_the_provider_triggers(airflow_db):
    listed = subprocess.run(
        [sys.executable, "-m", "airflow", "providers", "triggers", "--output", "json"],
        check=True,
        capture_output=True,
        text=True,
    )
    ours = [t["class"] for t in json.loads(listed.stdout) if t["package_name"] == "airflow-provider-checkpoint"]
    assert ours == ["airflow_provider_checkpoint.triggers.checkpoint"]
