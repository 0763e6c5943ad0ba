"""The reports behind the Checkpoints page's views and ``airflow checkpoints show``: overview, summary,
checkpoint detail, in-progress checkpoint and configuration.

They read untrusted documents: any JSON in place of a record, plan, lease, setting or XCom value
gives an answer the response models accept (malformed values ``null``), never an exception; and
well-formed documents give the figures computed here independently.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_checkpoint.core import stats
from airflow_provider_checkpoint.core.settings import CheckpointSettings
from airflow_provider_checkpoint.jobs import views
from airflow_provider_checkpoint.jobs.checkpoint_detail import checkpoint_detail, is_restore, step_tries
from airflow_provider_checkpoint.jobs.configuration import configuration
from airflow_provider_checkpoint.jobs.in_progress import in_progress
from airflow_provider_checkpoint.jobs.overview import overview, summary
from airflow_provider_checkpoint.jobs.registry import JobLocation, decode_entry
from airflow_provider_checkpoint.jobs.runs import DagFacts, RunFacts
from airflow_provider_checkpoint.plugin import models
from tests.unit.helpers import JOB, T0, make_env, run_checkpoint

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
KEYS = st.sampled_from(
    ["checkpoint_id", "status", "run_id", "steps", "sinks", "trigger_time", "end_time", "message", "restored",
     "committed_by", "records_in", "state_size", "attempt", "alignment_seconds", "kind", "target", "rows",
     "barrier", "run_id", "expires_at", "state_incremental", "state_merged_on_driver", "seconds"]
)  # fmt: skip
DOCUMENT = st.dictionaries(KEYS, JSON, max_size=10) | JSON
FACTS = st.builds(
    RunFacts,
    state=st.none() | st.sampled_from(["running", "success", "failed", "queued"]),
    tries=st.dictionaries(
        st.sampled_from(["s1", "s2", "checkpoint"]),
        st.lists(
            st.fixed_dictionaries(
                {
                    "try_number": st.integers(1, 5),
                    "state": st.none() | st.sampled_from(["success", "failed", "running"]),
                    "start": st.none() | st.floats(0, 2e9),
                    "end": st.none() | st.floats(0, 2e9),
                    "duration": st.none() | st.floats(0, 1e4),
                }
            ),
            max_size=3,
        ),
        max_size=3,
    ),
    xcoms=st.dictionaries(
        st.tuples(st.sampled_from(["s1", "s2", "checkpoint"]), st.sampled_from(["return_value", "ack"])),
        st.tuples(DOCUMENT, st.none() | st.floats(0, 2e9)),
        max_size=3,
    ),
)
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def served(model: Any, document: Any) -> Any:
    """``document`` as its route answers it: through the response model, to JSON."""
    return json.loads(model.model_validate(document).model_dump_json())


@FAST
@given(st.lists(DOCUMENT, max_size=8), FACTS, DOCUMENT, DOCUMENT)
def test_any_document_gives_an_answer_the_models_accept(records, facts, topology, plan):
    rows = [r for r in map(stats.history_row, records) if r is not None]
    served(models.Overview, overview(rows, [], bool(records), lambda i: f"chk-{i}/_metadata"))
    served(models.Summary, summary(rows))
    for record in records:
        for chained in (None, "checkpoint"):
            detail = checkpoint_detail(
                record, dag_id="d", metadata_url=None, facts=facts, topology=topology, plan_steps=plan,
                chained_task=chained,
            )  # fmt: skip
            assert (detail is None) == (stats.history_row(record) is None)
            if detail is not None:
                served(models.CheckpointDetail, detail)


@FAST
@given(DOCUMENT, DOCUMENT, FACTS, st.none() | st.just("checkpoint"))
def test_any_plan_lease_or_xcom_gives_an_in_progress_answer_or_none(plan, lease, facts, chained):
    found = in_progress(plan, lease, facts, chained)
    if found is not None:
        served(models.InProgress, found)


@FAST
@given(DOCUMENT, DOCUMENT, st.none() | st.text(max_size=10), st.none() | st.booleans())
def test_any_settings_or_topology_give_a_configuration(settings_, topology, schedule, chained):
    served(models.Configuration, configuration(settings_, topology, "file:///s/job", DagFacts(schedule, chained)))


# -- ground truth ------------------------------------------------------------------------
RECORD = st.fixed_dictionaries(
    {
        "status": st.sampled_from(["COMPLETED", "ABORTED"]),
        "duration_seconds": st.floats(0, 1e5),
        "state_size": st.integers(0, 1 << 40),
        "records_in": st.integers(0, 1 << 40),
        "restored_from_url": st.sampled_from(["", "file:///sp/savepoint-1"]),
        "end_time": st.floats(T0, T0 + 1e6),
        "reason": st.sampled_from(["", "declined", "expired"]),
    }
)


@FAST
@given(st.lists(RECORD, max_size=12), st.booleans())
def test_overview_and_summary_count_what_the_records_say(records, flying):
    for i, record in enumerate(records, 1):
        record.update(checkpoint_id=i, run_id=f"run-{i}", restored=bool(record["restored_from_url"]))
    rows = [stats.history_row(r) for r in records]
    shown = overview(rows, [], flying, lambda i: f"file:///job/chk-{i}/_metadata")
    done = [r for r in records if r["status"] == "COMPLETED"]
    failed = [r for r in records if r["status"] == "ABORTED"]
    assert shown["counts"] == {
        "completed": len(done),
        "failed": len(failed),
        "in_progress": int(flying),
        "restored": sum(1 for r in records if r["restored_from_url"]),
    }
    latest = shown["latest"]
    if done:
        assert latest["completed"] == {
            "checkpoint_id": done[-1]["checkpoint_id"], "time": done[-1]["end_time"], "run_id": done[-1]["run_id"],
            "path": f"file:///job/chk-{done[-1]['checkpoint_id']}/_metadata", "reason": "",
        }  # fmt: skip
    if failed:
        assert latest["failed"] == {
            "checkpoint_id": failed[-1]["checkpoint_id"], "time": failed[-1]["end_time"],
            "run_id": failed[-1]["run_id"], "path": "", "reason": failed[-1]["reason"],
        }  # fmt: skip
    assert (latest["completed"] is None) == (not done) and (latest["failed"] is None) == (not failed)

    figures = summary(rows)
    assert figures["checkpoints"] == len(done)
    for name in ("duration_seconds", "state_size", "records_in"):
        values = [float(r[name]) for r in done]
        expected = (min(values), statistics.fmean(values), max(values)) if values else (None, None, None)
        got = figures[name]
        assert (got["min"], got["max"]) == expected[::2]
        assert got["avg"] == expected[1] or abs(got["avg"] - expected[1]) <= 1e-9 * max(1.0, abs(expected[1]))
        for p in (50, 90, 99):  # nearest rank: the least value with at least p % of the values at or below it
            at_least = [v for v in values if 100 * sum(x <= v for x in values) >= p * len(values)]
            assert got[f"p{p}"] == (min(at_least) if values else None), (name, p)


def test_percentiles_of_a_hundred_checkpoints_are_flinks_ranks():
    rows = [
        stats.history_row({"checkpoint_id": i, "status": "COMPLETED", "duration_seconds": float(i), "records_in": i})
        for i in range(100, 0, -1)
    ]
    rows.append(stats.history_row({"checkpoint_id": 101, "status": "ABORTED", "duration_seconds": 1e6}))
    figures = summary(rows)
    assert figures["checkpoints"] == 100  # the aborted one's figures are partial: left out
    assert figures["duration_seconds"] == {"min": 1, "avg": 50.5, "p50": 50, "p90": 90, "p99": 99, "max": 100}
    assert figures["state_size"] == dict.fromkeys(("min", "avg", "p50", "p90", "p99", "max"))
    served(models.Summary, figures)


def test_a_restore_is_what_the_record_says_it_is():
    assert not is_restore({"restored": False, "restored_from": 3, "restored_from_url": ""})
    assert not is_restore({"restored_from": 3, "restored_from_url": ""}), "older records: the previous checkpoint"
    assert is_restore({"restored_from": 3, "restored_from_url": "file:///sp/x"})
    assert is_restore({"restored": True, "restored_from": 3, "restored_from_url": ""})


TRIES = [
    {"try_number": 1, "state": "failed", "start": 100.0, "end": 160.0, "duration": 60.0},
    {"try_number": 2, "state": "success", "start": 170.0, "end": 200.0, "duration": 30.0},
]


def test_a_detail_reads_every_recorded_figure():
    record = {
        "checkpoint_id": 7, "status": "COMPLETED", "run_id": "manual__2026-11-25T18:14:40+00:00", "type": "checkpoint",
        "trigger_time": 99.0, "end_time": 210.0, "committed_by": "trigger", "committed_by_run_id": "scheduled__x",
        "steps": {
            "s2": {"records_in": 5, "records_out": 4, "state_rows": 3, "state_bytes": 1000, "state_files": 2,
                   "state_incremental": True, "state_merged_on_driver": True, "seconds": 1.5, "attempt": 2,
                   "alignment_seconds": {"a": 0.5, "b": "slow", "": 1.0}},
            "s1": {"records_in": -1, "state_incremental": "yes"},
        },
        "sinks": {
            "dl": {"kind": "dead_letters", "step": "s2", "target": "s3://user:pw@host/dl", "rows": 2},
            "pg": {"kind": "postgres", "step": "s2", "target": "public.t", "rows": 4, "files": None,
                   "commit_time": 205.0, "delta_version": -3},
            "bad": ["not", "an", "object"],
        },
    }  # fmt: skip
    plan_steps = ["s1", "s2"]
    facts = RunFacts(state="success", tries={"s2": TRIES})
    detail = checkpoint_detail(record, dag_id="d", metadata_url="m", facts=facts, plan_steps=plan_steps)
    assert detail is not None
    assert detail["dag_run_url"] == "/dags/d/runs/manual__2026-11-25T18%3A14%3A40%2B00%3A00"
    assert (detail["committed_by"], detail["committed_by_run_id"]) == ("trigger", "scheduled__x")
    s1, s2 = detail["steps"]
    assert s1 == {**s1, "step": "s1", "attempts": [], "records_in": None, "incremental": None, "inline": None}
    assert s2 == {
        "step": "s2", "attempts": TRIES, "accepted_attempt": 2, "records_in": 5, "records_out": 4, "state_rows": 3,
        "state_bytes": 1000, "state_files": 2, "incremental": True, "inline": False, "merged_on_driver": True,
        "seconds": 1.5,
        "input_records": {}, "alignment_seconds": {"a": 0.5},
    }  # fmt: skip
    dl, pg = detail["sinks"]
    assert dl["target"] == "s3://***@host/dl" and dl["dead_letters_path"] == dl["target"] and "pw" not in str(detail)
    assert pg == {
        "uid": "pg", "kind": "postgres", "step": "s2", "target": "public.t", "rows": 4, "files": None, "bytes": None,
        "delta_version": None, "commit_time": 205.0, "dead_letters_path": None,
    }  # fmt: skip
    served(models.CheckpointDetail, detail)


def test_a_chained_task_s_tries_are_the_checkpoint_s_only_while_it_ran():
    tries = {"checkpoint": TRIES}
    assert step_tries("only", tries, "checkpoint", 180.0) == [TRIES[1]], "the retry cut checkpoint n+1"
    assert step_tries("only", tries, "checkpoint", 120.0) == [TRIES[0]]
    assert step_tries("only", tries, "checkpoint", None) == TRIES
    assert step_tries("only", tries, None, 120.0) == []


def test_in_progress_acks_come_from_xcom_for_this_checkpoint_or_a_successful_task():
    plan = {"run_id": "r", "steps": ["s1", "s2", "s3"], "barrier": {"checkpoint_id": 4, "trigger_time": 10.0}}
    lease = {"run_id": "r", "expires_at": 3610.0, "acquired_at": 10.0}
    facts = RunFacts(
        state="running",
        tries={"s2": [{**TRIES[1], "end": 50.0}], "s3": [{**TRIES[0], "state": "running"}]},
        xcoms={
            ("s1", "return_value"): ({"checkpoint_id": 4, "step": "s1"}, 30.0),
            ("s3", "return_value"): ({"checkpoint_id": 3, "step": "s3"}, 5.0),  # an ack of the previous checkpoint
        },
    )  # fmt: skip
    found = in_progress(plan, lease, facts)
    assert found == {
        "checkpoint_id": 4, "run_id": "r", "type": "checkpoint", "trigger_time": 10.0, "lease_holder": "r",
        "lease_expires": 3610.0,
        "steps": [
            {"step": "s1", "acked": True, "ack_time": 30.0, "state": None, "try_number": None},
            {"step": "s2", "acked": True, "ack_time": 50.0, "state": "success", "try_number": TRIES[1]["try_number"]},
            {"step": "s3", "acked": False, "ack_time": None, "state": "running", "try_number": TRIES[0]["try_number"]},
        ],
    }  # fmt: skip
    assert in_progress(plan, {"run_id": "other"}, RunFacts(state="failed")) is None, "abandoned: nobody works on it"
    assert in_progress(plan, None, RunFacts(state="running"))["lease_holder"] is None
    chained = RunFacts(state="running", xcoms={("checkpoint", "ack"): ({"checkpoint_id": 4, "step": "s1"}, 9.0)})
    assert in_progress({**plan, "steps": ["s1"]}, lease, chained, "checkpoint")["steps"][0]["acked"] is True


def test_configuration_is_the_recorded_settings():
    recorded = dataclasses.asdict(CheckpointSettings(retained_checkpoints=4, checkpoint_timeout_seconds=90.0))
    topology = {
        "nodes": {"e": {"kind": "source"}, "agg": {"kind": "stateful"}, "t": {"kind": "sink"}, "x": "junk"},
        "steps": {"step_t": ["e", "agg", "t"]},
    }
    shown = configuration(recorded, topology, "file:///s/job", DagFacts("*/10 * * * *", True))
    assert shown == {
        "schedule": "*/10 * * * *", "checkpoint_timeout_seconds": 90.0, "min_pause_seconds": 0.0,
        "tolerable_failed_checkpoints": 3, "retained_checkpoints": 4, "storage": "file:///s/job",
        "checkpoint_storage": "filesystem", "inline_state_threshold": 20 << 10, "incremental_state": True,
        "chain": True, "steps": ["step_t"], "sinks": ["t"], "sources": ["e"],
    }  # fmt: skip


def test_the_registry_entry_carries_the_settings_and_garbage_is_dropped():
    body = {"version": 1, "job_id": "j", "dag_id": "j", "settings": {"checkpoint_timeout_seconds": 5.0}}
    assert decode_entry(json.dumps(body).encode(), "e", "j").settings == {"checkpoint_timeout_seconds": 5.0}
    assert decode_entry(json.dumps({**body, "settings": [1]}).encode(), "e", "j").settings is None


def test_views_read_a_job_s_storage(tmp_path: Path, monkeypatch):
    def no_database(*args: object, **kwargs: object) -> None:
        raise OSError("no metadata database here")  # what Airflow knows is unknown, never an error

    monkeypatch.setattr(views, "run_facts", no_database)
    monkeypatch.setattr(views, "dag_facts", no_database)
    env = make_env(tmp_path)
    for n in (1, 2):
        run_checkpoint(env, f"run-{n}", now=T0 + 100 * n)
    env.coordinator.trigger("run-3", now=T0 + 300)
    location = JobLocation(JOB, "job_dag", f"file://{tmp_path}/ckpt")

    flying = views.in_progress_of(location)
    assert flying is not None and (flying["checkpoint_id"], flying["lease_holder"]) == (3, "run-3")
    assert [s["acked"] for s in flying["steps"]] == [False]
    shown = views.overview_of(location)
    assert shown["counts"] == {"completed": 2, "failed": 0, "in_progress": 1, "restored": 0}
    assert shown["latest"]["completed"]["path"] == f"file://{tmp_path}/ckpt/{JOB}/chk-2/_metadata"
    detail = views.detail_of(location, 3)
    assert detail is not None and detail["row"]["status"] == "IN_PROGRESS" and detail["metadata_path"] is None
    detail = views.detail_of(location, 1)
    assert detail is not None and [s["uid"] for s in detail["sinks"]] == ["table"]
    assert views.detail_of(location, 9) is None
    (env.job_dir / "_stats" / "1.json").write_text("[not a record")
    assert views.detail_of(location, 1)["row"]["status"] == "COMPLETED", "from _metadata when the record is unreadable"
    assert views.configuration_of(location)["steps"] == ["step_table"]


def test_cli_history_names_the_restored_snapshot_only_for_restores():
    from airflow_provider_checkpoint.cli.commands import _history_cells

    record = {"checkpoint_id": 4, "status": "COMPLETED", "restored_from": 3}
    url = "file:///sp/savepoint-1"
    cells = {
        "previous checkpoint": record,
        "restore (older record)": {**record, "restored_from_url": url},
        "restore": {**record, "restored": True},
        "restore of a savepoint": {**record, "restored": True, "restored_from_url": url},
        "no restore, whatever the url": {**record, "restored": False, "restored_from_url": url},
    }
    shown = {name: _history_cells(stats.history_row(r) or {})["restored from"] for name, r in cells.items()}
    assert shown == {
        "previous checkpoint": "-",
        "restore (older record)": url,
        "restore": 3,
        "restore of a savepoint": url,
        "no restore, whatever the url": "-",
    }
