from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import REPO


@pytest.fixture(scope="session")
def airflow_db() -> None:
    """Migrate the isolated SQLite metadata DB of this test session."""
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, capture_output=True)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``airflow checkpoints <argv>`` in this process, through Airflow's own parser: (exit code, out, err)."""
    from airflow.cli import cli_parser

    args = cli_parser.get_parser().parse_args(["checkpoints", *argv])
    capsys.readouterr()
    try:
        args.func(args)
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def checkpoints_client() -> tuple[Any, dict[str, str]]:
    """Airflow's own API app (the Checkpoints plugin mounted by Airflow, its auth) in this process,
    and the headers of an admin's token: ``client.get(f"/checkpoints/api/…", headers=headers)``."""
    from airflow.api_fastapi.app import create_app, get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from fastapi.testclient import TestClient

    client = TestClient(create_app("core"))  # initializes the auth manager
    token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="admin", role="admin"))
    return client, {"Authorization": f"Bearer {token}"}


LOCAL_BUNDLE = "airflow.dag_processing.bundles.local.LocalDagBundle"


def own_dags_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> ModuleType:
    """``source`` as ``<name>.py`` in a DAGs folder of its own, registered as a bundle beside ``dags/``; loaded."""
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / f"{name}.py").write_text(source)
    bundles = [
        {"name": "dags-folder", "classpath": LOCAL_BUNDLE, "kwargs": {"path": str(REPO / "dags")}},
        {"name": name, "classpath": LOCAL_BUNDLE, "kwargs": {"path": str(dags)}},
    ]
    monkeypatch.setenv("AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST", json.dumps(bundles))
    return load_dag_module(dags / f"{name}.py")


def load_dag_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def example_dag(airflow_db: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The example clickstream DAG, with its data, checkpoints and savepoints under ``tmp_path``."""
    monkeypatch.setenv("CLICKSTREAM_DIR", str(tmp_path / "clickstream"))
    monkeypatch.setenv("AIRFLOW__CHECKPOINT__STORAGE_ROOT", f"file://{tmp_path}/checkpoints")
    monkeypatch.setenv("AIRFLOW__CHECKPOINT__SAVEPOINT_ROOTS", f"file://{tmp_path}/savepoints,file://{tmp_path}/moved")
    (tmp_path / "clickstream" / "landing").mkdir(parents=True)
    yield load_dag_module(REPO / "dags" / "example_clickstream.py")
    os.environ.pop("CHECKPOINT_FAULTS", None)


@pytest.fixture
def restore_dag(example_dag: ModuleType) -> ModuleType:
    """The restore_from_checkpoint DAG, over the same storage as ``example_dag``."""
    return load_dag_module(REPO / "dags" / "restore_from_checkpoint.py")


@pytest.fixture
def sessions_dag(airflow_db: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The example sessions DAG, with its data and checkpoints under ``tmp_path``."""
    monkeypatch.setenv("SESSIONS_DIR", str(tmp_path / "sessions"))
    monkeypatch.setenv("AIRFLOW__CHECKPOINT__STORAGE_ROOT", f"file://{tmp_path}/checkpoints")
    (tmp_path / "sessions" / "landing").mkdir(parents=True)
    yield load_dag_module(REPO / "dags" / "example_sessions.py")


@pytest.fixture
def orders_dag(airflow_db: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The example orders DAG, with its data and checkpoints under ``tmp_path``."""
    monkeypatch.setenv("ORDERS_DIR", str(tmp_path / "orders"))
    monkeypatch.setenv("AIRFLOW__CHECKPOINT__STORAGE_ROOT", f"file://{tmp_path}/checkpoints")
    for directory in ("orders", "customers"):
        (tmp_path / "orders" / directory).mkdir(parents=True)
    yield load_dag_module(REPO / "dags" / "example_orders.py")
    os.environ.pop("CHECKPOINT_FAULTS", None)
