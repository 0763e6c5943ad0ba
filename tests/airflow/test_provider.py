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


def test_the_provider_info_is_valid_and_declares_the_plugin(airflow_db):
    """As edge3 does: the plugin named in ``get_provider_info`` is the entry point's class, under its name."""
    from importlib import resources

    import jsonschema
    from airflow.providers_manager import ProvidersManager

    from airflow_provider_checkpoint.get_provider_info import get_provider_info
    from airflow_provider_checkpoint.plugin import CheckpointsPlugin

    schema = json.loads(resources.files("airflow").joinpath("provider_info.schema.json").read_text())
    jsonschema.validate(get_provider_info(), schema)
    manager = ProvidersManager()
    manager.initialize_providers_plugins()
    (declared,) = [p for p in manager.plugins if p.provider_name == "airflow-provider-checkpoint"]
    assert declared.plugin_class == "airflow_provider_checkpoint.plugin.CheckpointsPlugin"
    assert declared.name == CheckpointsPlugin.name == "checkpoints"


def listed_plugin(env: dict[str, str]) -> dict:
    """The one ``checkpoints`` plugin ``airflow plugins`` lists, loaded from the package's entry point."""
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
    return plugin


def test_eager_provider_discovery_still_loads_the_plugin_once(airflow_db):
    """Eagerly discovered, the provider info's plugin has the entry point's name: Airflow skips it."""
    listed_plugin({**os.environ, "AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS": "False"})


def test_the_plugin_comes_from_the_entry_point_once_and_imports_no_api_server(airflow_db):
    """``plugins/`` is the plugins folder too: the plugin is still loaded once, from the package."""
    env = {**os.environ, "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins")}
    plugin = listed_plugin(env)
    assert [v["destination"] for v in plugin["external_views"]] == ["nav", "dag"]
    assert plugin["fastapi_apps"][0]["url_prefix"] == "/checkpoints"
    light = (
        "import sys, airflow_provider_checkpoint.plugin; print(sorted(m for m in sys.modules if 'api_fastapi' in m))"
    )
    imported = subprocess.run([sys.executable, "-c", light], check=True, capture_output=True, text=True, env=env)
    assert imported.stdout.strip() == "[]", (
        "every Airflow process loads plugins: this one imports the API only to serve"
    )
