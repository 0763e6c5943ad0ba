"""Test-wide isolation: a private AIRFLOW_HOME (SQLite), loopback Spark, no example DAGs.

The environment is set before anything imports Airflow, so no test touches a user's
Airflow installation.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings

REPO = Path(__file__).resolve().parent.parent
_HOME = Path(tempfile.mkdtemp(prefix="airflow-checkpoint-tests-"))

os.environ["AIRFLOW_HOME"] = str(_HOME)
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "dags")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "False"
os.environ["AIRFLOW__CHECKPOINT__STORAGE_ROOT"] = f"file://{_HOME}/checkpoints"
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
os.environ.pop("CHECKPOINT_FAULTS", None)
os.environ.pop("CHECKPOINT_FAULTS_FILE", None)

# s3 first: kafka imports it
pytest_plugins = ["tests.servers.s3", "tests.servers.postgres", "tests.servers.kafka", "tests.servers.statsd"]

# property tests check semantics, not speed: no per-example deadline on a loaded machine (two workers, chaos)
hypothesis_settings.register_profile("project", deadline=None)
hypothesis_settings.load_profile("project")

LIVE = "tests/live/"
CHAOS = "tests/live/test_chaos.py"
INSTALLED = "tests/live/test_installed_wheel.py"
CELERY = "tests/live/test_celery_topology.py"
OWN_SERVICES = (CHAOS, INSTALLED, CELERY)
"""Live test modules that start Airflow services of their own (not the shared ``live_airflow``)."""
FULL = os.environ.get("FULL_TESTS") == "1"
"""``make test-full``: the slow variants (``@pytest.mark.full``) run too, and the knobs read through
:func:`ci_or_full` take their full values. ``make test`` (CI) leaves them out to keep its time budget."""


def ci_or_full(name: str, ci: str, full: str) -> str:
    """The environment variable ``name``, else its CI default, or its full-run default under ``FULL_TESTS=1``."""
    return os.environ.get(name) or (full if FULL else ci)


SLOWEST_FIRST = (CHAOS, LIVE, CELERY, INSTALLED, "tests/airflow/test_cluster_execution.py")
"""Started first, so that the two workers ``make test`` runs (pytest-xdist) end together: the
longest groups first, the many short modules after them. The chaos test leaves about a third of
two cores idle (it waits for its scheduler), which the other worker's tests use. Measured (sessions
43-44): chaos about 245 s, the live group about 270 s, the installed wheel and cluster
execution about 110 s each, no other test above 90 s; the Celery topology runs only in
``make test-full`` (about 300 s)."""


FIRST_IN_LIVE = "tests/live/test_ui_savepoint.py"
"""Run first in the live group: the savepoint its run takes is one of the rows the Checkpoints views
(``test_ui_checkpoints_views.py``) need, which they would otherwise make with one more pipeline run."""


def worker_group(nodeid: str) -> str:
    """What one worker runs whole: a test module (module fixtures set up once), or every live test
    but those of :data:`OWN_SERVICES` (they share the live Airflow services, started once; the
    others start their own)."""
    module = nodeid.split("::", 1)[0]
    return LIVE if module.startswith(LIVE) and module not in OWN_SERVICES else module


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not FULL:
        slow = [item for item in items if item.get_closest_marker("full")]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if not item.get_closest_marker("full")]
    rank = {group: i for i, group in enumerate(SLOWEST_FIRST)}
    items.sort(
        key=lambda item: (rank.get(worker_group(item.nodeid), len(rank)), not item.nodeid.startswith(FIRST_IN_LIVE))
    )


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist hands out whole :func:`worker_group` groups, in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    return GroupScheduling(config, log)
