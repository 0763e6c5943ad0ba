"""Live end-to-end tests: the real Airflow services, driven through REST API v2 and the UI.

One session starts ``airflow api-server``, ``airflow scheduler`` and ``airflow
dag-processor`` (LocalExecutor, SQLite) with an isolated ``AIRFLOW_HOME`` and data
directories under a fresh temp directory, shared by every live test. Every test lands
events through :func:`Clickstream.land`, so the ground truth always covers everything
the pipeline could have read, whatever test ran before.

When a live test fails, the tails of the service logs and of the newest task logs are
attached to its report. The temp directory is kept after a failure (its path is in the
report) and deleted after a fully green session.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pytest

from airflow_provider_checkpoint.testing.clickstream import land_events, mismatches
from tests.live.airflow_live import LiveAirflow, running_airflow

_live: LiveAirflow | None = None


@pytest.fixture(scope="session")
def live_airflow(request: pytest.FixtureRequest) -> Iterator[LiveAirflow]:
    global _live
    root = Path(tempfile.mkdtemp(prefix="airflow-checkpoint-live-")).resolve()
    with running_airflow(root) as live:
        _live = live
        try:
            yield live
        finally:
            _live = None
    if request.session.testsfailed == 0:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"\nlive Airflow home, data and logs kept in {root}")


@dataclass
class Clickstream:
    """The example pipeline's landing directory and everything landed in this session."""

    live: LiveAirflow
    landed: list[pd.DataFrame] = field(default_factory=list)

    def land(self, n: int) -> pd.DataFrame:
        """Land ``n`` new events (unique timestamps across the session) as one JSON Lines file."""
        seed = len(self.landed) + 1
        events = land_events(self.live.landing, f"events-{seed:03d}.json", n, seed)
        self.landed.append(events)
        return events

    def truth(self) -> pd.DataFrame:
        return pd.concat(self.landed, ignore_index=True)

    def mismatches(self) -> dict[str, str]:
        """Sink tables vs the pandas ground truth over every event landed so far."""
        return mismatches(self.live.marts, self.truth())


@pytest.fixture(scope="session")
def clickstream(live_airflow: LiveAirflow) -> Clickstream:
    return Clickstream(live_airflow)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and _live is not None and item.get_closest_marker("live"):
        try:
            text = _live.diagnostics()
        except Exception as e:  # never hide the real failure
            text = f"(could not collect service logs: {e!r})"
        report.sections.append(("live Airflow service logs", text))
    return report
