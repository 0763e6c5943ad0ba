"""A savepoint taken the way a person takes it: in the real Airflow UI, in headless Chromium.

Logs in on the SimpleAuthManager login page, opens the example pipeline's trigger form,
checks that its switches are not marked required, switches "Take a savepoint" on and
triggers. The run must succeed (polled through the API, then seen in the UI), write a
savepoint, and leave the tables equal to the ground truth. The filled form is saved to
``test-artifacts/ui-savepoint-form.png``.

Needs Debian's ``chromium`` (the ``browser`` fixture of conftest.py).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import pytest

from tests.live.airflow_live import UI_SAVEPOINT_CONF, LiveAirflow
from tests.live.conftest import ARTIFACTS, UI_TIMEOUT_MS, Clickstream, log_in
from tests.live.storage_view import read_json, savepoint_dirs

pytestmark = pytest.mark.live

PIPELINE = "example_clickstream"
RUN_TIMEOUT = 360.0


def test_savepoint_from_the_ui_trigger_form(browser: Any, live_airflow: LiveAirflow, clickstream: Clickstream) -> None:
    from playwright.sync_api import expect

    live = live_airflow
    clickstream.land(120)
    before = savepoint_dirs(live.savepoint_root)
    ARTIFACTS.mkdir(exist_ok=True)

    context = browser.new_context(viewport={"width": 1400, "height": 1100})
    context.set_default_timeout(UI_TIMEOUT_MS)
    page = context.new_page()
    try:
        log_in(page, live, f"/dags/{PIPELINE}")

        # the trigger form, with the pipeline's savepoint params
        page.get_by_role("button", name="Trigger Dag").click()
        form = page.get_by_role("dialog")
        expect(form).to_contain_text(f"Trigger Dag - {PIPELINE}")
        savepoint = form.get_by_role("checkbox", name="Take a savepoint")
        stop = form.get_by_role("checkbox", name="Stop after the savepoint")
        expect(savepoint).not_to_be_checked()
        expect(stop).not_to_be_checked()
        # optional switches: Airflow marks a Param required ("*") unless its type allows null
        for title in ("Take a savepoint", "Stop after the savepoint"):
            expect(form.locator("label", has_text=title)).to_have_text(title)
        # the text field has no accessible name in Airflow 3.3's form: find it by its field name
        expect(form.locator('input[name="element_savepoint_dir"]')).to_have_value("")
        savepoint.locator("xpath=..").click()  # the visible switch (the input itself is visually hidden)
        expect(savepoint).to_be_checked()
        expect(stop).not_to_be_checked()
        page.screenshot(path=str(ARTIFACTS / "ui-savepoint-form.png"))

        with page.expect_response(
            lambda r: r.request.method == "POST" and r.url.endswith(f"/api/v2/dags/{PIPELINE}/dagRuns")
        ) as triggered:
            form.get_by_role("button", name="Trigger", exact=True).click()
        response = triggered.value
        assert response.status == 200, response.text()
        sent = json.loads(response.request.post_data or "{}")
        assert sent["conf"] == UI_SAVEPOINT_CONF, "the API test triggers savepoints with what the form sends"
        run_id = response.json()["dag_run_id"]

        live.wait_for_run(PIPELINE, run_id, timeout=RUN_TIMEOUT)

        # the UI shows the run as successful
        page.goto(f"{live.base_url}/dags/{PIPELINE}/runs/{quote(run_id, safe='')}")
        heading = page.get_by_role("heading", name=run_id)
        expect(heading.locator("xpath=..")).to_contain_text("Success")
        page.screenshot(path=str(ARTIFACTS / "ui-savepoint-run.png"))
    finally:
        context.close()

    new = savepoint_dirs(live.savepoint_root) - before
    assert len(new) == 1, f"expected one new savepoint under {live.savepoint_root}, found {sorted(new)}"
    (target,) = new
    meta = read_json(target / "_metadata")
    assert meta["type"] == "savepoint" and meta["relocatable"] is True
    job = read_json(live.job_dir / "_job.json")
    assert job["status"] == "RUNNING"
    assert any(sp["path"] == f"file://{target}" for sp in job["savepoints"])
    assert clickstream.mismatches() == {}
