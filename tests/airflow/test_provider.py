"""The provider as Airflow sees it: registered through the entry point, with its config section."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

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


def test_the_plugin_comes_from_the_entry_point_once_and_imports_no_api_server(airflow_db):
    """``plugins/`` is the plugins folder too: the plugin is still loaded once, from the package."""
    env = {**os.environ, "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins")}
    listed = subprocess.run(
        [sys.executable, "-m", "airflow", "plugins", "--output", "json"],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    (plugin,) = [p for p in json.loads(listed.stdout) if p["name"] == "checkpoints"]
    assert plugin["source"].endswith(
        "value='airflow_provider_checkpoint.plugin:CheckpointsPlugin', group='airflow.plugins')"
    )
    assert [v["destination"] for v in plugin["external_views"]] == ["nav", "dag"]
    assert plugin["fastapi_apps"][0]["url_prefix"] == "/checkpoints"
    light = (
        "import sys, airflow_provider_checkpoint.plugin; print(sorted(m for m in sys.modules if 'api_fastapi' in m))"
    )
    imported = subprocess.run([sys.executable, "-c", light], check=True, capture_output=True, text=True, env=env)
    assert imported.stdout.strip() == "[]", (
        "every Airflow process loads plugins: this one imports the API only to serve"
    )
