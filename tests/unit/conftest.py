"""Fixtures shared by the unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.helpers import Env, make_env


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    """A fresh job (see :func:`tests.unit.helpers.make_env`), with no injected faults."""
    monkeypatch.delenv("CHECKPOINT_FAULTS", raising=False)
    return make_env(tmp_path)
