"""Fixtures shared by the unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.helpers import T0, Env, SharedState, make_ack, make_env, run_checkpoint


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    """A fresh job (see :func:`tests.unit.helpers.make_env`), with no injected faults."""
    monkeypatch.delenv("CHECKPOINT_FAULTS", raising=False)
    return make_env(tmp_path)


@pytest.fixture
def shared_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SharedState:
    """retained=1; checkpoint 2 references a state file of checkpoint 1 (as incremental state would)."""
    monkeypatch.delenv("CHECKPOINT_FAULTS", raising=False)
    env = make_env(tmp_path, retained=1)
    _, first_ack = run_checkpoint(env, "run-1", T0)
    shared = first_ack.operators["counts"].handles[0]
    plan = env.coordinator.trigger("run-2", now=T0 + 10)
    env.coordinator.finalize(plan, [make_ack(env, plan, extra_handles=(shared,))], now=T0 + 11)
    return env, shared
