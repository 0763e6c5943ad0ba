from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO


@pytest.fixture(scope="session")
def airflow_db() -> None:
    """Migrate the isolated SQLite metadata DB of this test session."""
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, capture_output=True)


@pytest.fixture
def example_dag(airflow_db: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The example clickstream DAG, with its data and checkpoints under ``tmp_path``."""
    monkeypatch.setenv("CLICKSTREAM_DIR", str(tmp_path / "clickstream"))
    monkeypatch.setenv("AIRFLOW__CHECKPOINT__STORAGE_ROOT", f"file://{tmp_path}/checkpoints")
    (tmp_path / "clickstream" / "landing").mkdir(parents=True)
    spec = importlib.util.spec_from_file_location("example_clickstream", REPO / "dags" / "example_clickstream.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    os.environ.pop("CHECKPOINT_FAULTS", None)
