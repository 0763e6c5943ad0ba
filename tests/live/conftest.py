"""Live end-to-end tests: the real Airflow services, driven through REST API v2 and the UI.

The live tests share one ``airflow api-server``, ``scheduler``, ``dag-processor`` and
``triggerer`` (LocalExecutor, SQLite) with an isolated ``AIRFLOW_HOME`` and data
directories under a fresh temp directory, started for the first of them and stopped after
the last, so later tests do not share the two cores with idle services. Every test lands
events through :func:`Clickstream.land`, so the ground truth always covers everything
the pipeline could have read, whatever test ran before.

When a live test fails, the tails of the service logs and of the newest task logs are
attached to its report. The temp directory is kept after a failure (its path is in the
report) and deleted after a fully green session.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from airflow_provider_checkpoint.testing.clickstream import land_events, mismatches
from tests.live.airflow_live import REPO, LiveAirflow, running_airflow

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = REPO / "test-artifacts"

_live: LiveAirflow | None = None


@pytest.fixture(scope="package")
def live_airflow(request: pytest.FixtureRequest) -> Iterator[LiveAirflow]:
    global _live
    root = Path(tempfile.mkdtemp(prefix="airflow-checkpoint-live-")).resolve()
    faults = root / "faults.txt"  # empty: a test writes a fault for its run, and empties it after
    faults.write_text("")
    with running_airflow(root, extra_env={"CHECKPOINT_FAULTS_FILE": str(faults)}) as live:
        _live = live
        try:
            yield live
        finally:
            _live = None
    if request.session.testsfailed == 0:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"\nlive Airflow home, data and logs kept in {root}")


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; in CI the browser test must run: run scripts/install_browser.sh first")
    pytest.skip(f"{reason} (run scripts/install_browser.sh to install it)")


UI_TIMEOUT_MS = 60_000
"""How long a browser action or a UI assertion waits for the page: its condition is polled, so this
bounds a slow machine, not a sleep."""


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    """Headless Debian Chromium driven by Playwright; request it before ``live_airflow``, so a
    missing browser is found before the services start. Without Chromium or the ``playwright``
    package the browser tests are skipped, except in CI (``CI=true``), where they fail."""
    if not CHROMIUM.exists():
        _unavailable(f"{CHROMIUM} is not installed")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the playwright package is not installed in this environment")
    from playwright.sync_api import expect

    expect.set_options(timeout=UI_TIMEOUT_MS)  # the UI may render translated text late on a loaded machine
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def log_in(page: Any, live: LiveAirflow, path: str, user: str | None = None) -> None:
    """Open ``path`` of the Airflow UI; it sends us to the SimpleAuthManager login page and back (as the
    admin, or as ``user`` of :data:`.airflow_live.USER_ROLES`)."""
    page.goto(f"{live.base_url}{path}")
    page.get_by_label("Username").fill(user or live.username)
    page.get_by_label("Password").fill(live.passwords[user] if user else live.password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(rf".*{re.escape(path)}$"))


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


@pytest.fixture(scope="package")
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
