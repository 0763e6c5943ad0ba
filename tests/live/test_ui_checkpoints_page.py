"""The Checkpoints page and its endpoints, against the real Airflow services of the live session.

* The endpoints use Airflow's auth: 401 without a token, 403 for a forged token and for a user without access
  (SimpleAuthManager: a user without a role), 403 for a viewer who may read but not
  trigger; a crafted path outside the allowed roots answers 400 and changes nothing
  (no DAG run, no file written).

The page itself, in headless Chromium, is tested view by view in ``test_ui_checkpoints_views.py``.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest

from tests.live.airflow_live import LiveAirflow
from tests.live.conftest import Clickstream
from tests.live.storage_view import completed_ids, read_json

pytestmark = pytest.mark.live

PIPELINE = "example_clickstream"
API = f"/checkpoints/api/dags/{PIPELINE}"
RUN_TIMEOUT = 360.0


def ensure_checkpoints(live: LiveAirflow, clickstream: Clickstream, count: int) -> None:
    """At least ``count`` completed checkpoints (earlier live tests may have made them)."""
    while len(completed_ids(live.job_dir)) < count:
        clickstream.land(60)
        live.wait_for_run(PIPELINE, live.trigger(PIPELINE, {}), timeout=RUN_TIMEOUT)


def files(*roots: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for r in roots for p in r.rglob("*") if p.is_file()}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def run_count(live: LiveAirflow) -> int:
    return int(live.api_json("GET", f"/api/v2/dags/{PIPELINE}/dagRuns")["total_entries"])


def test_endpoints_honour_airflow_auth_and_refuse_crafted_paths(
    live_airflow: LiveAirflow, clickstream: Clickstream
) -> None:
    live = live_airflow
    ensure_checkpoints(live, clickstream, 1)
    plugins = {p["name"]: p for p in live.api_json("GET", "/api/v2/plugins")["plugins"]}
    views = {v["url_route"]: v for v in plugins["checkpoints"]["external_views"]}
    assert views["checkpoints"]["destination"] == "nav" and views["checkpoints-dag"]["destination"] == "dag"
    assert live.api_json("GET", "/api/v2/plugins/importErrors")["import_errors"] == []

    http = live.client
    savepoint = {"savepoint_dir": None, "stop": False}
    newest = completed_ids(live.job_dir)[-1]
    reads = [f"{API}/{route}" for route in ("status", "history", *VIEWS, f"checkpoints/{newest}")]
    for method, path, body in (
        ("GET", "/checkpoints/api/jobs", None),
        *(("GET", path, None) for path in reads),
        ("POST", f"{API}/savepoint", savepoint),
        ("POST", f"{API}/restore", {"checkpoint": "latest"}),
    ):
        assert http.request(method, path, json=body).status_code == 401, path
        # a forged token: Airflow answers 403 "Invalid JWT token", on its own API as on ours
        forged = http.request(method, path, json=body, headers=bearer("not-a-token"))
        assert (forged.status_code, forged.json()["detail"]) == (403, "Invalid JWT token"), path

    nobody, viewer = bearer(live.token_of("nobody")), bearer(live.token_of("viewer"))
    for path in reads:
        assert http.get(path, headers=nobody).status_code == 403, path
        assert http.get(path, headers=viewer).status_code == 200, path
    assert http.get("/checkpoints/api/jobs", headers=nobody).json() == [], "no access, no job listed"
    assert http.get(f"{API}/status", headers=viewer).json()["job_id"] == PIPELINE
    assert [j["dag_id"] for j in http.get("/checkpoints/api/jobs", headers=viewer).json()] == [PIPELINE]
    assert http.post(f"{API}/savepoint", json=savepoint, headers=viewer).status_code == 403
    assert http.post(f"{API}/restore", json={"checkpoint": "latest"}, headers=viewer).status_code == 403

    watched = (live.storage_root, live.savepoint_root, live.root / "outside")
    (live.root / "outside").mkdir(exist_ok=True)
    before, runs = files(*watched), run_count(live)
    crafted = [
        ("savepoint", {"savepoint_dir": f"{live.savepoint_root}/../outside", "stop": True}, "savepoint_dir refused"),
        ("savepoint", {"savepoint_dir": str(live.root / "outside")}, "savepoint_dir refused"),
        ("restore", {"checkpoint": "/etc", "trigger_pipeline": True}, "restore refused: path '/etc' is outside"),
        ("restore", {"checkpoint": f"{live.savepoint_root}/../outside"}, "restore refused: path"),
        ("restore", {"checkpoint": "s3://bucket/savepoints/x"}, "restore refused: path"),
        ("restore", {"checkpoint": "²"}, "restore refused: path '²' must be absolute"),
        ("restore", {"checkpoint": "9" * 4000}, "restore refused: checkpoint: id 999"),
    ]
    for action, body, message in crafted:
        r = live.api("POST", f"{API}/{action}", json=body)
        assert r.status_code == 400 and r.json()["detail"].startswith(message), (body, r.text)
    assert live.api("POST", f"{API}/history?limit=100000").status_code == 405
    assert live.api("GET", f"{API}/history?limit=100000").status_code == 422
    assert files(*watched) == before and run_count(live) == runs, "refused requests changed nothing"

    dry = live.api_json("POST", f"{API}/restore", json={"checkpoint": "latest", "dry_run": True})
    assert dry["dry_run"] is True and dry["checkpoint_id"] == completed_ids(live.job_dir)[-1]
    assert files(*watched) == before
    check_views_against_storage(live)


VIEWS = ("overview", "summary", "configuration", "in-progress")


def check_views_against_storage(live: LiveAirflow) -> None:
    """The overview, summary, configuration, in-progress and newest checkpoint's detail of a quiescent
    job against its files (``_stats``, ``_job.json``, ``_registry``) and Airflow's REST API."""
    records = [read_json(p) for p in (live.job_dir / "_stats").glob("*.json")]
    done = sorted((r for r in records if r["status"] == "COMPLETED"), key=lambda r: r["checkpoint_id"])
    newest = done[-1]
    metadata = f"file://{live.job_dir}/chk-{newest['checkpoint_id']}/_metadata"
    overview, summary, configuration, flying = (live.api_json("GET", f"{API}/{view}") for view in VIEWS)

    assert flying is None, "no checkpoint in flight between runs"
    assert overview["counts"] == {
        "completed": len(done),
        "failed": sum(r["status"] == "ABORTED" for r in records),
        "in_progress": 0,
        "restored": sum(bool(r.get("restored", bool(r.get("restored_from_url")))) for r in records),
    }
    latest = overview["latest"]["completed"]
    assert (latest["checkpoint_id"], latest["run_id"], latest["path"]) == (
        newest["checkpoint_id"],
        newest["run_id"],
        metadata,
    )
    assert summary["checkpoints"] == len(done)
    for figure in ("records_in", "duration_seconds", "state_size"):
        known = [float(r[figure]) for r in done]
        assert (summary[figure]["min"], summary[figure]["max"]) == (min(known), max(known)), figure

    job = read_json(live.job_dir / "_job.json")
    entry = read_json(live.storage_root / "_registry" / f"{PIPELINE}.json")
    dag = live.api_json("GET", f"/api/v2/dags/{PIPELINE}")
    nodes = job["topology"]["nodes"]
    assert configuration == {
        **configuration,
        "storage": f"file://{live.job_dir}",
        "schedule": dag["timetable_summary"],
        "chain": False,
        "steps": list(job["topology"]["steps"]),
        "sinks": sorted(uid for uid, n in nodes.items() if n["kind"] == "sink"),
        "sources": sorted(uid for uid, n in nodes.items() if n["kind"] == "source"),
        "retained_checkpoints": entry["retained_checkpoints"],
        "checkpoint_timeout_seconds": entry["settings"]["checkpoint_timeout_seconds"],
        "tolerable_failed_checkpoints": entry["settings"]["tolerable_failed_checkpoints"],
    }

    detail = live.api_json("GET", f"{API}/checkpoints/{newest['checkpoint_id']}")
    run_id = newest["run_id"]
    assert (detail["row"]["checkpoint_id"], detail["row"]["run_id"], detail["metadata_path"]) == (
        newest["checkpoint_id"], run_id, metadata
    )  # fmt: skip
    assert detail["dag_run_url"] == f"/dags/{PIPELINE}/runs/{quote(run_id, safe='')}"
    steps = {s["step"]: s for s in detail["steps"]}
    assert set(steps) == set(newest["steps"])
    for name, step in steps.items():
        figures = newest["steps"][name]
        assert (step["records_in"], step["seconds"]) == (figures.get("records_in"), figures["seconds"]), name
        task = live.api_json("GET", f"/api/v2/dags/{PIPELINE}/dagRuns/{quote(run_id, safe='')}/taskInstances/{name}")
        assert [a["try_number"] for a in step["attempts"]] == list(range(1, task["try_number"] + 1)), name
        assert step["attempts"][-1]["state"] == task["state"] == "success"
    assert {s["uid"] for s in detail["sinks"]} == {uid for uid, n in nodes.items() if n["kind"] == "sink"}
    assert live.api("GET", f"{API}/checkpoints/999999").status_code == 404
    assert live.api("GET", f"{API}/checkpoints/0").status_code == 422
