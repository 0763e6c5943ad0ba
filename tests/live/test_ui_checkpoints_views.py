"""The Checkpoints page's views in headless Chromium, against the real Airflow services of the live session.

Every figure the page shows is checked against the job's files on disk (``_stats/<id>.json``,
``_job.json``, ``chk-<id>/_metadata``, the savepoints), never against the JSON the page reads:

* History (in the timezone chosen in Airflow's UI, Airflow's time format) and a checkpoint's
  detail, opened by a row click and by its shareable URL; the DAG run link opens Airflow's run page.
* Overview (counts, latest of each kind), Summary (min / average / max, charts), Configuration.
* In progress while a savepoint taken with the page's button runs, then the savepoint on the page.
* The empty state of a pipeline that never ran; dark mode following Airflow's theme, live; every
  view's tables fit the DAG tab at 1280 px.

A test makes the pipeline runs only its own case needs (the savepoint of the page's button; the
:class:`Rare` checkpoints, made once for the module), in an order where they are the rows the later
tests need too: History's discarded checkpoint (more completed than retained) comes from them and from
the runs of ``test_live_sensors.py`` and ``test_ui_savepoint.py`` (run first in the live group,
``tests/conftest.py``). Run alone, a test makes the runs it is missing.

Screenshots of every view go to ``test-artifacts/``.
"""

from __future__ import annotations

import datetime
import decimal
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote
from zoneinfo import ZoneInfo

import pytest

from tests.live.airflow_live import LiveAirflow, poll
from tests.live.conftest import ARTIFACTS, UI_TIMEOUT_MS, Clickstream, log_in
from tests.live.storage_view import completed_ids, known_ids, read_json, savepoint_dirs
from tests.live.test_ui_checkpoints_page import API, PIPELINE, RUN_TIMEOUT, ensure_checkpoints, files, run_count

pytestmark = pytest.mark.live

ZONE = "Asia/Kolkata"  # not the machine's: the page must use the one chosen in Airflow
NEVER_RAN = "example_orders"  # a pipeline of the DAGs folder no live test triggers
RUN_SHOWS_MS = 180_000  # a triggered run's checkpoint shows once the scheduler started its first task
RETAINED = 3  # the example pipeline's retained_checkpoints
FINALIZE = "finalize_checkpoint"


# -- what the page must show, computed from the files, formatted as the page formats -------
def _round(x: float) -> int:
    return math.floor(x + 0.5)  # JavaScript's Math.round


def _fixed1(x: float) -> str:
    """JavaScript's ``x.toFixed(1)``: the float's exact value, a tie rounds up (Python's rounds to even)."""
    return str(decimal.Decimal(x).quantize(decimal.Decimal("0.1"), rounding=decimal.ROUND_HALF_UP))


def fmt_time(seconds: float | None, zone: str = ZONE) -> str:
    if seconds is None:
        return "-"
    return datetime.datetime.fromtimestamp(seconds, ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M:%S")


def fmt_duration(s: float | None) -> str:
    """Airflow's own duration format: ``00:00:49.282`` under a minute, ``00:04:05`` under a day, ``3d04:00:00``."""
    if s is None:
        return "-"
    fixed3 = decimal.Decimal(s).quantize(decimal.Decimal("0.001"), rounding=decimal.ROUND_HALF_UP)  # toFixed(3)
    ms = max(0, _round(float(fixed3) * 1000))
    total = ms // 1000
    clock = f"{total // 3600 % 24:02d}:{total // 60 % 60:02d}:{total % 60:02d}"
    if total < 60 and ms % 1000:
        return f"{clock}.{ms % 1000:03d}"
    return clock if total < 86400 else f"{total // 86400}d{clock}"


def nearest_rank(values: list[float], p: int) -> float:
    """The least value with at least ``p`` % of the values at or below it (Flink's percentiles)."""
    return min(v for v in values if 100 * sum(x <= v for x in values) >= p * len(values))


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    units, v, u = ["B", "KiB", "MiB", "GiB", "TiB"], float(n), 0
    while v >= 1024 and u < len(units) - 1:
        v, u = v / 1024, u + 1
    return f"{_round(n)} B" if u == 0 else f"{_fixed1(v)} {units[u]}"


def fmt_count(n: float | None) -> str:
    return "-" if n is None else str(_round(n))


def all_stats(live: LiveAirflow) -> dict[int, dict[str, Any]]:
    return {int(p.stem): read_json(p) for p in (live.job_dir / "_stats").glob("*.json")}


def written(stats: dict[str, Any]) -> int | None:
    """What a checkpoint wrote: its steps' state bytes and its sinks' bytes; ``None`` when neither is
    known (an aborted checkpoint whose acks were not recorded)."""
    parts = [s.get("state_bytes") for s in stats.get("steps", {}).values()]
    known = [n for n in parts + [s.get("bytes") for s in stats.get("sinks", {}).values()] if n is not None]
    return sum(known) if known else None


def duration(stats: dict[str, Any]) -> float | None:
    """A checkpoint's duration: the recorded one, else (aborted) from its trigger to its end."""
    trigger, end = stats.get("trigger_time"), stats.get("end_time")
    if stats.get("duration_seconds") is not None or trigger is None or end is None:
        return stats.get("duration_seconds")
    return round(end - trigger, 3)


# -- driving the page ----------------------------------------------------------------
@pytest.fixture(scope="module")
def signed_in(browser: Any, live_airflow: LiveAirflow) -> dict[str, Any]:
    """The browser storage of an admin signed in on Airflow's login page, with Airflow's timezone set to
    ZONE (as its timezone selector stores it): each test's page starts from it, in a context of its own."""
    context = browser.new_context()
    context.set_default_timeout(UI_TIMEOUT_MS)
    try:
        p = context.new_page()
        log_in(p, live_airflow, f"/dags/{PIPELINE}")
        p.evaluate("zone => localStorage.setItem('timezone', JSON.stringify(zone))", ZONE)
        return dict(context.storage_state())
    finally:
        context.close()


@pytest.fixture
def page(browser: Any, signed_in: dict[str, Any]) -> Iterator[Any]:
    """A signed-in admin's page at 1280 px (the DAG tab's iframe is then 936 px wide), in Airflow's timezone ZONE."""
    ARTIFACTS.mkdir(exist_ok=True)
    context = browser.new_context(viewport={"width": 1280, "height": 1000}, storage_state=signed_in)
    context.set_default_timeout(UI_TIMEOUT_MS)
    try:
        yield context.new_page()
    finally:
        context.close()


def open_tab(page: Any, live: LiveAirflow, dag_id: str = PIPELINE) -> Any:
    page.goto(f"{live.base_url}/dags/{dag_id}/plugin/checkpoints-dag")
    return page.frame_locator("iframe")


def show(frame: Any, tab: str, view: str) -> None:
    from playwright.sync_api import expect

    frame.locator("#tabs").get_by_role("link", name=tab, exact=True).click()
    expect(frame.locator("#view")).to_have_attribute("data-view", view)


def table_rows(frame: Any, table: str) -> list[dict[str, str]]:
    headers = [h.strip() for h in frame.locator(f"#{table} thead th").all_inner_texts()]
    return [
        dict(zip(headers, [c.strip() for c in row.locator("th, td").all_inner_texts()], strict=False))
        for row in frame.locator(f"#{table} tbody tr").all()
    ]


def fields(frame: Any, scope: str) -> dict[str, str]:
    terms = frame.locator(f"{scope} dt").all_inner_texts()
    return dict(zip(terms, [d.strip() for d in frame.locator(f"{scope} dd").all_inner_texts()], strict=True))


def inner_frame(page: Any) -> Any:
    (frame,) = [f for f in page.frames if "/checkpoints/ui/" in f.url]
    return frame


def shot(page: Any, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"checkpoints-{name}.png"), full_page=True)


# -- the views -------------------------------------------------------------------------
def test_jobs_list(page: Any, live_airflow: LiveAirflow, clickstream: Clickstream) -> None:
    from playwright.sync_api import expect

    live = live_airflow
    ensure_checkpoints(live, clickstream, 1)
    page.goto(f"{live.base_url}/plugin/checkpoints")  # Browse → Checkpoints
    frame = page.frame_locator("iframe")
    row = frame.locator("#jobs tbody tr", has_text=PIPELINE)
    job = read_json(live.job_dir / "_job.json")
    expect(row.locator("td").nth(2)).to_have_text(job["status"])
    expect(row.locator("td").nth(3)).to_have_text(str(completed_ids(live.job_dir)[-1]))
    shot(page, "jobs")
    row.get_by_role("link", name=PIPELINE, exact=True).last.click()  # the DAG column: Airflow's DAG page
    expect(page).to_have_url(re.compile(rf".*/dags/{PIPELINE}$"))
    page.goto(f"{live.base_url}/plugin/checkpoints")
    frame.locator("#jobs tbody tr", has_text=PIPELINE).locator("td").nth(2).click()  # the row: the job's tab
    expect(page).to_have_url(re.compile(rf".*/dags/{PIPELINE}/plugin/checkpoints-dag$"))  # the address bar too
    expect(page.frame_locator("iframe").locator("#title")).to_have_text(f"Checkpoints of {PIPELINE}")


@dataclass(frozen=True)
class Rare:
    """Checkpoints of the rare cases, made for real with the live session's fault file."""

    aborted: int
    """Aborted by a storage error writing its ``_metadata``."""
    by_trigger: int
    """Its finalize died after ``_metadata`` and was not retried: the next run's trigger commits it."""


@pytest.fixture(scope="module")
def rare(live_airflow: LiveAirflow, clickstream: Clickstream) -> Rare:
    """:class:`Rare`'s two runs, made once for the module. Its tests need more rows than these: they reuse
    the runs earlier tests made (a savepoint of the page's button, one of Airflow's trigger form: see
    ``tests/conftest.py``) and make one only when missing."""
    live = live_airflow
    faults = live.root / "faults.txt"

    def run_with(fault: str, retried: bool = True) -> int:
        checkpoint = max(known_ids(live.job_dir), default=0) + 1
        faults.write_text(fault.format(checkpoint=checkpoint) + "\n")
        try:
            clickstream.land(40)
            run_id = live.trigger(PIPELINE, {})
            if not retried:  # its task failed at once, as an operator marks it, not again after the retry delay
                ti = f"/api/v2/dags/{PIPELINE}/dagRuns/{quote(run_id, safe='')}/taskInstances/{FINALIZE}"
                poll(f"{FINALIZE} to fail", lambda: live.api_json("GET", ti)["state"] == "up_for_retry", RUN_TIMEOUT)
                live.api_json("PATCH", ti, json={"new_state": "failed"})
            live.wait_for_run(PIPELINE, run_id, timeout=RUN_TIMEOUT, expect_success=False)
        finally:
            faults.write_text("")
        return checkpoint

    aborted = run_with("storage.write:file=_metadata:action=oserror")  # this run's _metadata: no other write
    return Rare(aborted, run_with("finalize.after_metadata:checkpoint={checkpoint}", retried=False))


def committed_stats(live: LiveAirflow, clickstream: Clickstream, checkpoint_id: int) -> dict[str, Any]:
    """The stats record of ``checkpoint_id`` (of :attr:`Rare.by_trigger`), after a next run committed it: one more
    run when none came since."""
    path = live.job_dir / "_stats" / f"{checkpoint_id}.json"
    if not path.exists():
        clickstream.land(40)
        live.wait_for_run(PIPELINE, live.trigger(PIPELINE, {}), timeout=RUN_TIMEOUT)
    return dict(read_json(path))


def test_in_progress_while_a_savepoint_runs(
    page: Any, live_airflow: LiveAirflow, clickstream: Clickstream, rare: Rare
) -> None:
    """The savepoint the page's button takes, in progress then done. Its run's trigger first commits the
    checkpoint of :attr:`Rare.by_trigger` (until then the view may show that one: it is not checked empty first)."""
    from playwright.sync_api import expect

    live = live_airflow
    clickstream.land(40)
    frame = open_tab(page, live)
    show(frame, "In progress", "in-progress")

    before = savepoint_dirs(live.savepoint_root)
    with page.expect_response(lambda r: r.request.method == "POST" and r.url.endswith(f"{API}/savepoint")) as sent:
        frame.get_by_role("button", name="Take savepoint").click()
    assert sent.value.status == 200, sent.value.text()
    run_id = sent.value.json()["dag_run_id"]
    expect(frame.locator("#message")).to_contain_text(f"Savepoint run {run_id} triggered")

    progress = frame.locator("#progress")
    expect(progress).to_contain_text(run_id, timeout=RUN_SHOWS_MS)  # polled by the page, not reloaded
    checkpoint_id = read_json(live.job_dir / "_job.json")["last_checkpoint_id"]
    expect(progress).to_contain_text(f"#{checkpoint_id} (savepoint)")
    steps = read_json(live.job_dir / "_job.json")["topology"]["steps"]
    expect(frame.locator("#acks tbody tr")).to_have_count(len(steps))
    assert {r["Step"] for r in table_rows(frame, "acks")} == set(steps)
    expect(frame.locator("#acked")).to_have_text(re.compile(rf"^\d+/{len(steps)} steps$"))
    shot(page, "in-progress")

    live.wait_for_run(PIPELINE, run_id, timeout=RUN_TIMEOUT)
    expect(frame.locator("#no-progress")).to_be_visible()  # nothing in flight between runs
    (target,) = poll("the savepoint directory", lambda: savepoint_dirs(live.savepoint_root) - before, 30)
    assert read_json(target / "_metadata")["checkpoint_id"] == checkpoint_id
    show(frame, "Overview", "overview")
    expect(frame.locator("#savepoints tbody tr").first).to_contain_text(f"file://{target}")
    show(frame, "History", "history")
    newest = frame.locator("#history tbody tr").first
    expect(newest.locator("td").first).to_have_text(str(checkpoint_id))
    expect(newest).to_contain_text("savepoint")
    by_trigger = read_json(live.job_dir / "_stats" / f"{rare.by_trigger}.json")
    assert (by_trigger["committed_by"], by_trigger["committed_by_run_id"]) == ("trigger", run_id), by_trigger
    assert clickstream.mismatches() == {}


def test_detail_shows_a_full_abort_reason_and_a_commit_by_the_next_trigger(
    page: Any, live_airflow: LiveAirflow, clickstream: Clickstream, rare: Rare
) -> None:
    """The rare cases on the page: the aborted checkpoint's full reason (not in a tooltip), and who committed
    the checkpoint its finalize left."""
    from playwright.sync_api import expect

    live = live_airflow
    committed = committed_stats(live, clickstream, rare.by_trigger)
    record = read_json(live.job_dir / "_stats" / f"{rare.aborted}.json")
    assert record["status"] == "ABORTED" and record["message"], record
    page.goto(f"{live.base_url}/checkpoints/ui/?dag_id={PIPELINE}#checkpoint={rare.aborted}")
    box = page.locator("#abort-reason")
    expect(box).to_be_visible()
    expect(box).to_have_text(f"{record['reason']} {record['message']}")  # all of it, in the page
    assert box.evaluate("e => e.scrollHeight <= e.clientHeight && e.scrollWidth <= e.clientWidth")
    shown = page.locator(".card dl.fields").first.inner_text()
    assert "- rows" not in shown and "(sinks -)" not in shown, f"dash fragments in an aborted detail: {shown}"
    page.goto(f"{live.base_url}/checkpoints/ui/?dag_id={PIPELINE}#history?status=ABORTED")  # a shared History link
    status = page.locator(f'#history tbody tr[data-id="{rare.aborted}"] td.status')
    expect(status).to_contain_text(f"{record['reason']} {record['message']}")  # the whole reason, as in the detail
    expect(page.locator("#filter-status")).to_have_value("ABORTED")

    assert (committed["status"], committed["committed_by"]) == ("COMPLETED", "trigger"), committed
    page.goto(f"{live.base_url}/checkpoints/ui/?dag_id={PIPELINE}#checkpoint={rare.by_trigger}")
    expect(page.locator("#abort-reason")).to_have_count(0)
    facts = page.locator(".card dt", has_text="Committed by").locator("xpath=following-sibling::dd[1]")
    expect(facts).to_contain_text(f"the next run's trigger (run {committed['committed_by_run_id']})")
    page.screenshot(path=str(ARTIFACTS / "checkpoints-detail-trigger-commit.png"), full_page=True)


def test_history_and_checkpoint_detail(page: Any, live_airflow: LiveAirflow, clickstream: Clickstream) -> None:
    from playwright.sync_api import expect

    live = live_airflow
    while sum(s["status"] == "COMPLETED" for s in all_stats(live).values()) <= RETAINED:  # one discarded
        clickstream.land(20)
        live.wait_for_run(PIPELINE, live.trigger(PIPELINE, {}), timeout=RUN_TIMEOUT)
    frame = open_tab(page, live)
    expect(frame.locator("#tz")).to_have_text(f"times in {ZONE}")
    show(frame, "History", "history")
    stats = all_stats(live)
    retained = set(completed_ids(live.job_dir))
    newest = sorted(stats, reverse=True)[:20]
    expect(frame.locator("#history tbody tr")).to_have_count(len(newest))
    rows = table_rows(frame, "history")
    assert [int(r["ID"]) for r in rows] == newest
    for row, cid in zip(rows, newest, strict=True):
        truth = stats[cid]
        assert row["Status"].startswith(truth["status"]), row
        if truth["status"] != "COMPLETED":  # the whole reason, as the detail shows it, not just "declined"
            assert " ".join(row["Status"].split()).endswith(" ".join(f"{truth['reason']} {truth['message']}".split()))
        kind = "restore" if truth.get("restored") else truth.get("type", "checkpoint")
        assert row["Kind"] == kind, row
        assert row["Trigger time"] == fmt_time(truth.get("trigger_time")), row
        assert row["Duration"] == fmt_duration(duration(truth)), row
        assert row["Records in"] == fmt_count(truth.get("records_in")), row
        assert row["State size"] == fmt_bytes(truth.get("state_size")), row
        assert row["Written"] == fmt_bytes(written(truth)), row
        if truth["status"] == "COMPLETED":
            assert row["Written"] != row["State size"], "Written counts the sinks' bytes too"
        restored = truth.get("restored_from_url") or f"checkpoint {truth.get('restored_from')}"
        assert row["Restored from"] == (restored if truth.get("restored") else "-"), row
        assert row["DAG run"] == truth["run_id"], row
        discarded = truth["status"] == "COMPLETED" and cid not in retained  # Flink marks them so
        assert ("discarded" in row["Status"]) is discarded, row
    clipped = inner_frame(page).evaluate(LINES, "#history td.clip")  # DAG run, Restored from: cut, tooltip whole
    assert set(clipped) == {1}, f"a clipped History cell wraps at 1280 px: {clipped}"
    badge = frame.locator("#history tbody tr td.status .badge").first
    expect(badge.locator("svg.state-icon")).to_have_count(1)  # Airflow's state badge: its icon, then the state
    shot(page, "history")
    check_history_filters_sort_and_address(page, frame, stats)

    frame = open_tab(page, live)
    show(frame, "History", "history")
    chosen = next(cid for cid in newest if stats[cid]["status"] == "COMPLETED")
    truth = stats[chosen]
    frame.locator(f'#history tbody tr[data-id="{chosen}"] td').nth(2).click()
    expect(frame.locator("#detail-title")).to_have_text(f"Checkpoint {chosen}")
    assert inner_frame(page).url.endswith(f"?dag_id={PIPELINE}#checkpoint={chosen}")
    check_detail(frame, live, chosen, truth)
    shot(page, "detail")

    run_link = frame.get_by_role("link", name=truth["run_id"], exact=True)
    expect(run_link).to_have_attribute("target", "_top")
    run_link.click()  # Airflow's iframe may not navigate the top window: the page asks Airflow's router
    expect(page).to_have_url(re.compile(rf".*/dags/{PIPELINE}/runs/{re.escape(quote(truth['run_id'], safe=''))}$"))
    expect(page.get_by_role("heading", name=truth["run_id"])).to_be_visible()

    # the detail's URL, shared: the page on its own opens the same checkpoint
    page.goto(f"{live.base_url}/checkpoints/ui/?dag_id={PIPELINE}#checkpoint={chosen}")
    expect(page.locator("#detail-title")).to_have_text(f"Checkpoint {chosen}")
    check_detail(page, live, chosen, truth)

    gone = min(cid for cid, s in stats.items() if s["status"] == "COMPLETED" and cid not in retained)
    page.goto(f"{live.base_url}/checkpoints/ui/?dag_id={PIPELINE}#checkpoint={gone}")
    expect(page.locator("#discarded-note")).to_contain_text("cannot be restored")
    page.goto(f"{live.base_url}/checkpoints/ui/?dag_id={PIPELINE}#checkpoint=999999")
    expect(page.locator("#unknown-checkpoint")).to_contain_text("No checkpoint 999999")
    expect(page.locator('#tabs a[aria-selected="true"]')).to_have_count(0)

    # a step's try opens its task instance (its logs) in Airflow
    page.goto(f"{live.base_url}/checkpoints/ui/?dag_id={PIPELINE}#checkpoint={chosen}")
    step, figures = next(iter(truth["steps"].items()))
    page.locator(f'#steps tr[data-step="{step}"] ul.attempts a').last.click()
    run = re.escape(quote(truth["run_id"], safe=""))
    expect(page).to_have_url(
        re.compile(rf".*/dags/{PIPELINE}/runs/{run}/tasks/{step}\?try_number={figures['attempt']}$")
    )


def shown_ids(frame: Any) -> list[int]:
    return [int(i) for i in frame.locator("#history tbody tr").evaluate_all("rows => rows.map((r) => r.dataset.id)")]


def check_history_filters_sort_and_address(page: Any, frame: Any, stats: dict[int, dict[str, Any]]) -> None:
    """History filtered by status and kind, sorted by a head's click, paged; each state is the address of
    Airflow's tab too: a reload opens the same page."""
    from playwright.sync_api import expect

    def kind(s: dict[str, Any]) -> str:
        return "restore" if s.get("restored") else s.get("type", "checkpoint")

    def wait_for(expected: list[int], state: str) -> None:
        """The History of address ``state`` is shown (not an earlier one), with the rows ``expected``."""
        expect(frame.locator("#history")).to_have_attribute("data-state", state)
        poll(f"History to show {expected}", lambda: shown_ids(frame) == expected, UI_TIMEOUT_MS / 1000, interval=0.2)

    newest_first = sorted(stats, reverse=True)
    status = "ABORTED" if any(s["status"] == "ABORTED" for s in stats.values()) else "COMPLETED"
    frame.locator("#filter-status").select_option(status)
    wait_for([c for c in newest_first if stats[c]["status"] == status][:20], f"history?status={status}")
    expect(page).to_have_url(re.compile(rf"#history\?status={status}$"))  # Airflow's address bar keeps it
    shot(page, "history-filtered")
    frame.locator("#clear-filters").click()
    wait_for(newest_first[:20], "history")
    frame.locator("#filter-kind").select_option("checkpoint")
    checkpoints = [c for c in newest_first if kind(stats[c]) == "checkpoint"]
    wait_for(checkpoints[:20], "history?kind=checkpoint")

    def by(figure: Callable[[dict[str, Any]], float | None], descending: bool) -> list[int]:
        """Unknown values last either way, ties newest first."""
        known = {c: v for c in checkpoints if (v := figure(stats[c])) is not None}
        rest = [c for c in checkpoints if c not in known]
        return sorted(known, key=lambda c: known[c] * (-1 if descending else 1)) + rest

    frame.locator("#history thead th", has_text="Duration").click()  # longest first
    wait_for(by(duration, True)[:20], "history?kind=checkpoint&sort=duration")
    expect(frame.locator("#history thead th", has_text="Duration")).to_have_attribute("aria-sort", "descending")
    frame.locator("#history thead th", has_text="Duration").click()  # again: shortest first
    wait_for(by(duration, False)[:20], "history?kind=checkpoint&sort=duration&order=asc")
    frame.locator("#history thead th", has_text="Trigger time").click()
    by_time = by(lambda s: s.get("trigger_time"), True)
    wait_for(by_time[:20], "history?kind=checkpoint&sort=time")
    expect(page).to_have_url(re.compile(r"#history\?kind=checkpoint&sort=time$"))

    # two rows a page: page 2 is in the address, and a reload of Airflow's tab opens it again
    assert len(checkpoints) >= 3, "page 2 of two rows needs three checkpoints"
    inner_frame(page).evaluate("location.hash = 'history?kind=checkpoint&sort=time&size=2'")
    wait_for(by_time[:2], "history?kind=checkpoint&sort=time&size=2")
    frame.locator("#older").click()
    wait_for(by_time[2:4], "history?kind=checkpoint&sort=time&page=2&size=2")
    expect(page).to_have_url(re.compile(r"#history\?kind=checkpoint&sort=time&page=2&size=2$"))
    expect(frame.locator("#page-info")).to_contain_text(f"Page 2 of {math.ceil(len(checkpoints) / 2)}")
    page.reload()
    frame = page.frame_locator("iframe")
    wait_for(by_time[2:4], "history?kind=checkpoint&sort=time&page=2&size=2")
    expect(frame.locator("#filter-kind")).to_have_value("checkpoint")
    shot(page, "history-page-2-after-reload")
    frame.locator(f'#history tbody tr[data-id="{by_time[2]}"] td').nth(2).click()
    expect(frame.locator("#detail-title")).to_have_text(f"Checkpoint {by_time[2]}")
    frame.locator("a.back").click()  # back to the page it was opened from
    wait_for(by_time[2:4], "history?kind=checkpoint&sort=time&page=2&size=2")


def check_detail(frame: Any, live: LiveAirflow, checkpoint_id: int, truth: dict[str, Any]) -> None:
    from playwright.sync_api import expect

    expect(frame.locator("#steps tbody tr")).to_have_count(len(truth["steps"]))
    steps = {r["Step"]: r for r in table_rows(frame, "steps")}
    assert steps.keys() == truth["steps"].keys()
    for name, step in truth["steps"].items():
        shown = steps[name]
        assert shown["Records"] == f"{fmt_count(step.get('records_in'))} in · {fmt_count(step.get('records_out'))} out"
        assert f"#{step['attempt']}" in shown["Attempts"], shown
        tries = frame.locator(f'#steps tr[data-step="{name}"] ul.attempts a')
        run = re.escape(quote(truth["run_id"], safe=""))
        expect(tries.last).to_have_attribute(
            "href", re.compile(rf".*/dags/{PIPELINE}/runs/{run}/tasks/{name}\?try_number={step['attempt']}$")
        )
        if step.get("state_rows") is not None:
            inline = step.get("state_inline") == 1  # the state travels in _metadata, whole
            where = "inline in _metadata" if inline else f"{step['state_files']} files"
            figures = f"{step['state_rows']} rows · {fmt_bytes(step['state_bytes'])} · {where}"
            how = (
                "whole (inline state is written whole)"
                if inline
                else "incremental"
                if step["state_incremental"]
                else "full"
            )
            merged = "the driver" if step["state_merged_on_driver"] else "Spark"
            assert shown["State"] == f"{figures}\n{how}, merged by {merged}", shown
    sinks = {r["Sink"].split("\n")[0]: r for r in table_rows(frame, "sinks")}
    assert sinks.keys() == truth["sinks"].keys()
    for uid, sink in truth["sinks"].items():
        shown = sinks[uid]
        assert shown["Sink"] == f"{uid}\nin {sink['step']}" and shown["Kind"] == sink["kind"], shown
        assert shown["Rows"] == fmt_count(sink.get("rows")) and shown["Files"] == fmt_count(sink.get("files")), shown
        assert shown["Bytes"] == fmt_bytes(sink.get("bytes")) and shown["Target"] == sink["target"], shown
        assert shown["Committed at"] == fmt_time(sink.get("commit_time")), shown
    metadata = live.job_dir / f"chk-{checkpoint_id}" / "_metadata"
    assert metadata.exists()
    expect(frame.locator("#metadata-path")).to_have_text(f"file://{metadata}")
    facts = fields(frame, ".card")
    assert facts["Trigger time"] == fmt_time(truth["trigger_time"]) and facts["End time"] == fmt_time(truth["end_time"])
    assert facts["Written"].startswith(fmt_bytes(written(truth)))
    per_source = ", ".join(f"{uid} {n}" for uid, n in sorted(truth.get("source_malformed", {}).items()) if n)
    malformed = fmt_count(truth.get("malformed_records"))
    assert facts["Malformed records"] == (f"{malformed} ({per_source})" if per_source else malformed), facts
    by = "the next run's trigger" if truth["committed_by"] == "trigger" else "finalize"
    assert facts["Committed by"].startswith(by), facts


def test_overview_summary_and_configuration(page: Any, live_airflow: LiveAirflow, clickstream: Clickstream) -> None:
    from playwright.sync_api import expect

    live = live_airflow
    ensure_checkpoints(live, clickstream, 2)
    stats = all_stats(live)
    job = read_json(live.job_dir / "_job.json")
    frame = open_tab(page, live)
    show(frame, "Overview", "overview")
    completed = [cid for cid, s in stats.items() if s["status"] == "COMPLETED"]
    counts = {
        "Completed": len(completed),
        "Failed": sum(s["status"] == "ABORTED" for s in stats.values()),
        "In progress": 0,
        "Restored": sum(bool(s.get("restored")) for s in stats.values()),
    }
    for label, n in counts.items():
        expect(frame.locator(".stat", has_text=label).locator(".stat-value")).to_have_text(str(n))
    latest = {r[""]: r for r in table_rows(frame, "latest")}
    newest = max(completed)
    assert latest["Completed"]["Checkpoint"] == f"#{newest}"
    assert latest["Completed"]["Location"] == f"file://{live.job_dir}/chk-{newest}/_metadata"
    completion = read_json(live.job_dir / f"chk-{newest}" / "_metadata")["completion_time"]
    assert latest["Completed"]["Time"] == fmt_time(completion) == fmt_time(stats[newest]["end_time"])
    restores = [cid for cid, s in stats.items() if s.get("restored")]
    if restores:  # one restore time: the trigger of the checkpoint that restored
        when = fmt_time(stats[max(restores)]["trigger_time"])
        assert latest["Restore"]["Time"] == when
        last = frame.locator(".card dt", has_text="Last restore").locator("xpath=following-sibling::dd[1]")
        expect(last).to_contain_text(f" at {when} from ")
    if job["savepoints"]:
        savepoint = max(job["savepoints"], key=lambda s: s["checkpoint_id"])
        assert latest["Savepoint"]["Checkpoint"] == f"#{savepoint['checkpoint_id']}"
        assert latest["Savepoint"]["Location"] == savepoint["path"]
    shot(page, "overview")
    completed_row = frame.locator("#latest").get_by_role("row", name=re.compile(r"^Completed "))
    completed_row.get_by_role("link", name=f"#{newest}").click()  # the newest may be the latest savepoint too
    expect(frame.locator("#detail-title")).to_have_text(f"Checkpoint {newest}")

    show(frame, "Summary", "summary")
    done = [stats[cid] for cid in completed]
    expect(frame.locator("#summary-count")).to_contain_text(f"the {len(done)} ")
    summary = {r[""]: r for r in table_rows(frame, "summary")}
    for label, figure, fmt in (
        ("End-to-end duration", lambda s: s["duration_seconds"], fmt_duration),
        ("Checkpointed data size", lambda s: s["state_size"], fmt_bytes),
        ("Processed rows", lambda s: s["records_in"], fmt_count),
        ("Written (state and sinks)", written, fmt_bytes),
    ):
        values = [figure(s) for s in done]
        expected = {"Min": fmt(min(values)), "Average": fmt(sum(values) / len(values)), "Max": fmt(max(values))}
        expected |= {f"p{p}": fmt(nearest_rank(values, p)) for p in (50, 90, 99)}
        assert {k: summary[label][k] for k in expected} == expected, label
    expect(frame.locator("#summary thead th")).to_have_text(["", "Min", "Average", "p50", "p90", "p99", "Max"])
    recent = sorted(stats, reverse=True)[:100]
    expect(frame.locator("#chart-duration circle")).to_have_count(len(recent))
    inner = inner_frame(page)
    assert min(inner.evaluate(RENDERED_TEXT_PX, "#view svg text")) >= 11.5, "chart labels render at 12 px"
    line = frame.locator("#chart-duration polyline.series").get_attribute("points") or ""
    assert len(line.split()) == sum(stats[c]["status"] == "COMPLETED" for c in recent), "the line joins completed only"
    expect(frame.locator("#chart-size circle")).to_have_count(sum(stats[c]["status"] == "COMPLETED" for c in recent))
    shot(page, "summary")

    show(frame, "Configuration", "configuration")
    config = fields(frame, "#configuration")
    topology = job["topology"]
    kinds = {uid: node["kind"] for uid, node in topology["nodes"].items()}
    assert set(config["Steps"].split(", ")) == set(topology["steps"])
    assert set(config["Sources"].split(", ")) == {u for u, k in kinds.items() if k == "source"}
    assert set(config["Sinks"].split(", ")) == {u for u, k in kinds.items() if k == "sink"}
    assert config["Storage"] == f"file://{live.job_dir}"
    assert config["Retained checkpoints"] == "3" and len(completed_ids(live.job_dir)) <= 3  # the DAG's setting
    assert config["Schedule"] == "none (triggered only)"
    shot(page, "configuration")


def test_a_pipeline_that_never_ran_shows_how_to_start(page: Any, live_airflow: LiveAirflow) -> None:
    from playwright.sync_api import expect

    live = live_airflow
    poll(f"{NEVER_RAN} to be parsed", lambda: live.api("GET", f"/api/v2/dags/{NEVER_RAN}").status_code == 200, 120)
    assert not (live.storage_root / NEVER_RAN).exists()
    frame = open_tab(page, live, NEVER_RAN)
    empty = frame.locator("#empty")
    expect(empty).to_contain_text(f"{NEVER_RAN} has not run yet")
    expect(empty).to_contain_text("Trigger the DAG")
    paused = live.api_json("GET", f"/api/v2/dags/{NEVER_RAN}")["is_paused"]
    expect(frame.locator("#paused")).to_have_count(1 if paused else 0)  # said when it is so
    for name in ("Take savepoint", "Stop with savepoint", "Restore…"):
        expect(frame.get_by_role("button", name=name)).to_be_disabled()
    expect(frame.locator("#savepoint-dir")).to_be_disabled()
    expect(frame.locator("#message")).to_be_hidden()
    expect(frame.locator("#tabs")).to_be_hidden()
    shot(page, "empty")


def test_restore_dialog_offers_retained_snapshots_confirms_a_run_and_keeps_a_refusal(
    page: Any, live_airflow: LiveAirflow, clickstream: Clickstream
) -> None:
    """The dialog lists latest, the retained checkpoints and the savepoints (no discarded one), sends a typed
    path exactly as typed (``"latest "`` is refused, and the refusal outlives the page's refreshes), asks
    before triggering a run (off by default) and dims Airflow's page around it."""
    from playwright.sync_api import expect

    live = live_airflow
    ensure_checkpoints(live, clickstream, 1)
    frame = open_tab(page, live)
    show(frame, "Overview", "overview")
    dialog, runs = frame.locator("#restore-dialog"), run_count(live)
    watched = (live.job_dir, live.savepoint_root)
    before = files(*watched)

    frame.get_by_role("button", name="Restore…").click()
    expect(dialog).to_be_visible()
    expect(page.locator("#checkpoints-veil")).to_be_attached()  # Airflow's page around the iframe, dimmed
    retained = sorted(completed_ids(live.job_dir), reverse=True)
    savepoints = sorted(read_json(live.job_dir / "_job.json")["savepoints"], key=lambda sp: -sp["checkpoint_id"])
    offered = frame.locator("#restore-choice option").evaluate_all("options => options.map((o) => o.value)")
    assert offered == ["latest", *map(str, retained), *(sp["path"] for sp in savepoints), ""]
    trigger = dialog.locator('input[name="trigger_pipeline"]')
    expect(trigger).not_to_be_checked()
    trigger.locator("xpath=..").click()
    dialog.get_by_role("button", name="Restore", exact=True).click()
    expect(frame.locator("#restore-confirm")).to_contain_text(f"a run of {PIPELINE} starts at once")
    expect(dialog.get_by_role("button", name="Restore and trigger")).to_be_visible()
    shot(page, "restore-dialog")
    dialog.get_by_role("button", name="Cancel").click()
    expect(page.locator("#checkpoints-veil")).to_have_count(0)

    frame.get_by_role("button", name="Restore…").click()
    frame.locator("#restore-choice").select_option(value="")
    frame.locator("#restore-path").fill("latest ")
    with page.expect_response(lambda r: r.url.endswith(f"{API}/restore")) as answered:
        dialog.get_by_role("button", name="Restore", exact=True).click()
    assert answered.value.status == 400 and answered.value.request.post_data_json["checkpoint"] == "latest "
    message, view = frame.locator("#message"), frame.locator("#view")
    expect(message).to_contain_text("surrounding whitespace")
    renders = int(view.get_attribute("data-renders") or 0)
    expect(view).to_have_attribute("data-renders", str(renders + 2))  # two refreshes later
    expect(message).to_contain_text("surrounding whitespace")
    frame.locator("#message-close").click()
    expect(message).to_be_hidden()

    frame.get_by_role("button", name="Restore…").click()
    frame.locator("#restore-choice").select_option(value=str(retained[-1]))
    dialog.locator('input[name="dry_run"]').locator("xpath=..").click()
    dialog.get_by_role("button", name="Restore", exact=True).click()
    expect(message).to_contain_text(f"Dry run: {PIPELINE} can be restored from checkpoint {retained[-1]} at")
    assert files(*watched) == before and run_count(live) == runs, "nothing written, no run triggered"


def test_a_viewer_sees_the_actions_disabled_with_the_reason(browser: Any, live_airflow: LiveAirflow) -> None:
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    context.set_default_timeout(UI_TIMEOUT_MS)
    try:
        page = context.new_page()
        log_in(page, live_airflow, f"/dags/{PIPELINE}/plugin/checkpoints-dag", user="viewer")
        frame = page.frame_locator("iframe")
        expect(frame.locator("#actions-note")).to_contain_text("Read-only: your role may view this DAG")
        for name in ("Take savepoint", "Stop with savepoint", "Restore…"):
            expect(frame.get_by_role("button", name=name)).to_be_disabled()
        expect(frame.locator("#savepoint-dir")).to_be_disabled()
        shot(page, "viewer")
    finally:
        context.close()


LINES = """(selector) => [...document.querySelectorAll(selector)].map((cell) => {
  const text = document.createRange();
  text.selectNodeContents(cell);
  return new Set([...text.getClientRects()].map((r) => Math.round(r.top))).size;
})"""

RENDERED_TEXT_PX = """(selector) => [...document.querySelectorAll(selector)].map((t) => {
  const svg = t.ownerSVGElement;
  return parseFloat(getComputedStyle(t).fontSize) * svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
})"""

CONTRAST = """([selector, property, behind]) => {  // WCAG contrast ratio of a color against a background
  const luminance = (color) => {
    const c = document.createElement("canvas").getContext("2d");
    c.fillStyle = color;
    c.fillRect(0, 0, 1, 1);
    const [r, g, b] = [...c.getImageData(0, 0, 1, 1).data].slice(0, 3)
      .map((v) => (v / 255 <= 0.03928 ? v / 255 / 12.92 : ((v / 255 + 0.055) / 1.055) ** 2.4));
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const a = luminance(getComputedStyle(document.querySelector(selector))[property]);
  const b = luminance(getComputedStyle(document.querySelector(behind)).backgroundColor);
  return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
}"""

LIGHTNESS = """(selector) => {
  const c = document.createElement("canvas").getContext("2d");  // any CSS color (oklch, rgb) to sRGB
  c.fillStyle = getComputedStyle(document.querySelector(selector || "body")).backgroundColor;
  c.fillRect(0, 0, 1, 1);
  const [r, g, b] = c.getImageData(0, 0, 1, 1).data;
  return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255;
}"""

FITS = """() => [...document.querySelectorAll("table")].filter((t) => t.getBoundingClientRect().right
  > document.documentElement.clientWidth + 0.5 || t.parentElement.scrollWidth > t.parentElement.clientWidth)
  .map((t) => t.id).concat(document.documentElement.scrollWidth > document.documentElement.clientWidth ? ["page"] : [])
  .concat([...document.querySelectorAll("td.time")].filter((td) => {
    const text = document.createRange();
    text.selectNodeContents(td);
    const lines = new Set([...text.getClientRects()].map((r) => Math.round(r.top))).size;
    return lines > 1 || td.scrollWidth > td.clientWidth;
  }).map((td) => `time ${td.textContent} wraps`))"""


def test_dark_mode_follows_airflow_and_tables_fit_1280(
    page: Any, live_airflow: LiveAirflow, clickstream: Clickstream
) -> None:
    from playwright.sync_api import expect

    live = live_airflow
    ensure_checkpoints(live, clickstream, 1)
    page.goto(f"{live.base_url}/api/v2/monitor/health")  # Airflow's origin, for its storage
    page.evaluate("localStorage.setItem('theme', 'dark')")  # Airflow's color mode (next-themes)
    frame = open_tab(page, live)
    expect(page.locator("html")).to_have_class("dark")
    expect(frame.locator("html")).to_have_class("dark")
    inner = inner_frame(page)
    assert inner.evaluate(LIGHTNESS) < 0.3, "the page's background is dark"
    views = [
        ("Overview", "overview"),
        ("History", "history"),
        ("Summary", "summary"),
        ("Configuration", "configuration"),
        ("In progress", "in-progress"),
    ]
    for tab, view in views:
        show(frame, tab, view)
        assert inner.evaluate(FITS) == [], f"{view} does not fit the DAG tab at 1280 px"
        if view == "overview":  # cards and table heads sit above Airflow's page, not black on its navy
            page_tone = inner.evaluate(LIGHTNESS)
            assert page_tone < inner.evaluate(LIGHTNESS, ".card") < inner.evaluate(LIGHTNESS, "thead th") < 0.3
        if view == "summary":  # the chart's line stands out on Airflow's dark card (WCAG: 3:1 for graphics)
            assert inner.evaluate(CONTRAST, ["#chart-duration .series", "stroke", ".charts .card"]) >= 3
        shot(page, f"dark-{view}")
    newest = max(all_stats(live))
    inner.evaluate(f"location.hash = 'checkpoint={newest}'")
    expect(frame.locator("#detail-title")).to_have_text(f"Checkpoint {newest}")
    assert inner.evaluate(FITS) == [], "the detail does not fit the DAG tab at 1280 px"
    shot(page, "dark-detail")

    # switched back in Airflow's own menu, the open page follows at once
    page.get_by_role("button", name="User").click()
    page.get_by_role("menuitem", name="Appearance").click()
    page.get_by_text("Light Mode", exact=True).click()
    expect(frame.locator("html")).to_have_class("light")
    poll("the page to turn light", lambda: inner.evaluate(LIGHTNESS) > 0.7, UI_TIMEOUT_MS / 1000, interval=0.2)
