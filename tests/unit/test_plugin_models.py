"""The plugin's response models carry exactly the JSON the status and restore functions produce."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from airflow_provider_checkpoint.jobs import reports, views
from airflow_provider_checkpoint.jobs.registry import JobLocation
from airflow_provider_checkpoint.plugin.models import HistoryPage, JobDetail, RestoreSummary, SavepointTriggered
from airflow_provider_checkpoint.restore.requests import request_restore
from tests.unit.helpers import JOB, T0, make_env, run_checkpoint


def served(model: type[BaseModel], document: dict[str, Any], exclude_unset: bool = False) -> Any:
    """The JSON the route answers with: ``document`` through its response model."""
    return json.loads(model.model_validate(document).model_dump_json(exclude_unset=exclude_unset))


def test_status_history_and_restore_keep_their_json(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    for n in (1, 2):
        run_checkpoint(env, f"run-{n}", now=T0 + 100 * n)
    summary = request_restore(env.storage, env.storage.url("chk-1"), False, dry_run=False)
    location = JobLocation(JOB, "job_dag", f"file://{tmp_path}/ckpt")
    pending = {**reports.job_status(location), "savepoints": [], "retained": [2, 1], "can_act": False}
    assert pending["pending_restore"] and served(JobDetail, pending) == json.loads(json.dumps(pending))
    run_checkpoint(env, "run-3", now=T0 + 300)  # restores checkpoint 1
    detail = {
        **reports.job_status(location),
        "savepoints": reports.savepoints(env.storage),
        "retained": [3],
        "can_act": True,
    }
    page = reports.history(env.storage, 0, 2)

    assert detail["last_restore"] and page["total"] == 3
    assert served(JobDetail, detail) == json.loads(json.dumps(detail))
    assert served(HistoryPage, page) == json.loads(json.dumps(page))
    assert served(RestoreSummary, summary, exclude_unset=True) == json.loads(json.dumps(summary))
    conf = {"savepoint": True, "savepoint_dir": None, "stop_after_savepoint": False}
    triggered = {"dag_id": "job_dag", "dag_run_id": "manual__1", "conf": conf}
    assert served(SavepointTriggered, triggered) == triggered


def test_rows_keep_keys_they_do_not_declare(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    run_checkpoint(env, "run-1", now=T0)
    page = reports.history(env.storage)
    page["rows"][0]["malformed_records"] = 4
    location = JobLocation(JOB, "job_dag", f"file://{tmp_path}/ckpt")
    detail = {**reports.job_status(location), "savepoints": [], "retained": [1], "can_act": True}
    detail["malformed_records"] = 4

    assert served(HistoryPage, page)["rows"][0]["malformed_records"] == 4
    assert served(JobDetail, detail)["malformed_records"] == 4


def test_history_marks_checkpoints_retention_deleted_as_discarded(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    for n in range(1, 6):
        run_checkpoint(env, f"run-{n}", now=T0 + 100 * n)
    on_disk = {int(p.parent.name[4:]) for p in (tmp_path / "ckpt" / JOB).glob("chk-*/_metadata")}
    rows = reports.history(env.storage)["rows"]
    assert 0 < len(on_disk) < len(rows) == 5, "retention deleted some, kept some"
    assert {r["checkpoint_id"]: r["discarded"] for r in rows} == {i: i not in on_disk for i in range(1, 6)}
    assert [r["discarded"] for r in served(HistoryPage, reports.history(env.storage, 3, 2))["rows"]] == [True, True]


def test_every_view_shows_the_metadata_completion_time(tmp_path: Path) -> None:
    """Jobs list, Overview, History and detail: one completion time, the ``_metadata``'s (not when the
    stats were written: finalize here runs at ``T0 + 101``, its commit later, in real time)."""
    env = make_env(tmp_path)
    run_checkpoint(env, "run-1", now=T0 + 100)
    written = json.loads((tmp_path / "ckpt" / JOB / "chk-1" / "_metadata").read_text())["completion_time"]
    location = JobLocation(JOB, "job_dag", f"file://{tmp_path}/ckpt")

    shown = {
        "jobs list": reports.job_status(location)["latest_completed"]["completion_time"],
        "overview": views.overview_of(location)["latest"]["completed"]["time"],
        "history": reports.history(env.storage)["rows"][0]["end_time"],
        "detail": views.detail_of(location, 1)["row"]["end_time"],  # type: ignore[index]
    }
    assert written == T0 + 101 and shown == dict.fromkeys(shown, written)
    assert reports.history(env.storage)["rows"][0]["duration_seconds"] == written - T0 - 100


def test_history_filters_by_status_and_kind_and_sorts_by_id_time_or_duration(tmp_path: Path) -> None:
    from airflow_provider_checkpoint.exceptions import RefusedInputError
    from airflow_provider_checkpoint.storage.stats import StatsStore

    env = make_env(tmp_path)
    store = StatsStore(env.storage)
    kinds = {1: "checkpoint", 2: "savepoint", 3: "restore", 4: "checkpoint", 5: "checkpoint", 6: "savepoint"}
    durations = {1: 4.0, 2: 9.5, 3: None, 4: 0.25, 5: 9.5, 6: 2.0}
    for cid, kind in kinds.items():
        store.write(
            cid,
            {
                "checkpoint_id": cid,
                "status": "ABORTED" if cid in (4, 5) else "COMPLETED",
                "type": "savepoint" if kind == "savepoint" else "checkpoint",
                "restored": kind == "restore",
                "trigger_time": T0 + 10 * (7 - cid),  # the newest triggered first: time order is not id order
                "duration_seconds": durations[cid],
            },
        )

    def ids(**how: Any) -> list[int]:
        page = reports.history(env.storage, 0, 20, **how)
        assert page["total"] == len(page["rows"])
        served(HistoryPage, page)
        return [r["checkpoint_id"] for r in page["rows"]]

    assert ids() == [6, 5, 4, 3, 2, 1]
    assert ids(descending=False) == [1, 2, 3, 4, 5, 6]
    assert ids(status="ABORTED") == [5, 4] and ids(status="UNKNOWN") == []
    assert ids(kind="savepoint") == [6, 2] and ids(kind="restore") == [3] and ids(kind="checkpoint") == [5, 4, 1]
    assert ids(kind="checkpoint", status="COMPLETED") == [1]
    assert ids(sort="time") == [1, 2, 3, 4, 5, 6] and ids(sort="time", descending=False) == [6, 5, 4, 3, 2, 1]
    assert ids(sort="duration") == [5, 2, 1, 6, 4, 3], "longest first, ties newest first, unknown last"
    assert ids(sort="duration", descending=False) == [4, 6, 1, 5, 2, 3], "unknown last either way"
    assert [r["checkpoint_id"] for r in reports.history(env.storage, 2, 2, sort="duration")["rows"]] == [1, 6]
    for bad in ({"status": "completed"}, {"kind": "restores"}, {"sort": "size"}):
        with pytest.raises(RefusedInputError, match="must be one of"):
            reports.history(env.storage, **bad)  # type: ignore[arg-type]
