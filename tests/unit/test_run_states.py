"""The trigger's lease check reads DAG run states as Airflow reports them (plain strings or enums)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from airflow.sdk import DagRunState
from airflow.utils.state import DagRunState as CoreDagRunState

from airflow_provider_checkpoint.operators.checkpoint import _run_is_active


@dataclass
class _Ti:
    """Answers ``get_dagrun_state`` as the task runner does: with whatever state it was given."""

    state: object

    def get_dagrun_state(self, dag_id: str, run_id: str) -> object:
        return self.state


@pytest.mark.parametrize(
    ("state", "active"),
    [
        ("queued", True),
        ("running", True),
        ("success", False),
        ("failed", False),
        (DagRunState.RUNNING, True),
        (DagRunState.SUCCESS, False),
        (CoreDagRunState.FAILED, False),
        (CoreDagRunState.QUEUED, True),
    ],
)
def test_lease_holder_run_is_active_until_it_ends(state: object, active: bool) -> None:
    assert _run_is_active(_Ti(state), {"dag_id": "d", "run_id": "r"}) is active


def test_lease_without_a_run_is_kept() -> None:
    assert _run_is_active(_Ti("success"), {}) is True
