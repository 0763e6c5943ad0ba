"""Dead letters through real Airflow (``dag.test()``), real Spark and injected faults.

A pipeline whose sources route malformed records to dead letters (the pipeline's
default, tables in the default place) runs four checkpoints over JSON and CSV files that
mix good and malformed lines; one step attempt dies before acking, one finalize dies after
``_metadata`` and before the sink commit. After every run the dead-letter tables equal the
malformed lines of the committed files, judged by Python's own parse (no loss, no
duplicate), the outputs equal pandas over the good lines, and ``airflow checkpoints
history`` shows the counts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from airflow_provider_checkpoint.jobs.audit import audit_job
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.testing.clickstream import read_table
from airflow_provider_checkpoint.testing.malformed import DEAD_LETTER_KEY, ground_truth, land_mixed, sorted_frame
from tests.airflow.conftest import own_dags_folder
from tests.airflow.test_cli_and_own_storage import cli

pytestmark = pytest.mark.airflow
JOB = "dead_letter_clicks"
DAG_FILE = """
import datetime
import os

from airflow_provider_checkpoint import CheckpointedPipeline, FileSource, KeyedAggregate, ParquetTableSink
from airflow_provider_checkpoint.testing.malformed import SCHEMA

BASE = os.environ["DEAD_LETTER_DIR"]

with CheckpointedPipeline(
    dag_id="dead_letter_clicks", schedule=None, on_malformed="dead_letter", retry_delay=datetime.timedelta(seconds=1)
) as pipeline:
    clicks = FileSource(uid="clicks", path=f"{BASE}/json", format="json", schema=SCHEMA)
    totals = KeyedAggregate(uid="totals", input=clicks, keys=["user"], aggs={"n": "count", "last": "max(ts)"})
    ParquetTableSink(uid="totals_table", input=totals, path=f"{BASE}/totals", mode="upsert", keys=["user"])
    orders = FileSource(uid="orders", path=f"{BASE}/csv", format="csv", schema=SCHEMA)
    ParquetTableSink(uid="orders_table", input=orders, path=f"{BASE}/orders", mode="append")

dag = pipeline.dag
"""
SOURCES = (("clicks", "json"), ("orders", "csv"))


def check_tables(base: Path, dead_letters: Path, landed: dict[str, dict[int, list[str]]]) -> dict[str, pd.DataFrame]:
    """Dead letters and outputs against the ground truth of ``landed`` (committed files); the dead letters."""
    truth = {uid: ground_truth(uid, base / f, f, landed[f]) for uid, f in SOURCES}
    for uid, (_, dead) in truth.items():
        got = read_table(dead_letters / uid)
        assert len(got) == len(dead), f"{uid}: {len(got)} dead letters, {len(dead)} malformed lines"
        if len(dead):
            pd.testing.assert_frame_equal(
                sorted_frame(got, DEAD_LETTER_KEY), sorted_frame(dead, DEAD_LETTER_KEY), check_dtype=False
            )
    columns = ["user", "page", "ts"]
    good_csv, good_json = truth["orders"][0], truth["clicks"][0]
    pd.testing.assert_frame_equal(
        sorted_frame(read_table(base / "orders"), columns), sorted_frame(good_csv, columns), check_dtype=False
    )
    totals = good_json.groupby("user").agg(n=("ts", "size"), last=("ts", "max")).reset_index()
    got = read_table(base / "totals").sort_values("user").reset_index(drop=True)
    pd.testing.assert_frame_equal(got[["user", "n", "last"]], totals, check_dtype=False)
    return {uid: dead for uid, (_, dead) in truth.items()}


def test_dead_letters_are_committed_exactly_once_through_faults(airflow_db, tmp_path, monkeypatch, capsys):
    base = tmp_path / "data"
    monkeypatch.setenv("DEAD_LETTER_DIR", str(base))
    monkeypatch.setenv("AIRFLOW__CHECKPOINT__STORAGE_ROOT", f"file://{tmp_path}/checkpoints")
    module = own_dags_folder(tmp_path, monkeypatch, "dead_letter_clicks", DAG_FILE)
    job_dir = tmp_path / "checkpoints" / JOB
    dead_letters = job_dir / "dead_letters"  # the documented default place
    landed: dict[str, dict[int, list[str]]] = {"json": {}, "csv": {}}
    faults = {2: "step.before_ack:checkpoint=2:attempt=1", 3: "finalize.after_metadata:checkpoint=3"}
    run_ids: dict[int, str] = {}
    for checkpoint_id in range(1, 5):
        for _, f in SOURCES:
            name = f"{f}-{checkpoint_id}.{f}"
            land_mixed(base / f, name, f, 30 + 7 * checkpoint_id, seed=checkpoint_id)
            landed[f][checkpoint_id] = [name]
        if checkpoint_id in faults:
            monkeypatch.setenv("CHECKPOINT_FAULTS", faults[checkpoint_id])
        else:
            monkeypatch.delenv("CHECKPOINT_FAULTS", raising=False)

        run = module.dag.test()
        run_ids[checkpoint_id] = run.run_id

        if checkpoint_id == 3:  # committed in storage, not yet in the sinks: readers still see checkpoint 2
            assert run.state == "failed" and (job_dir / "chk-3" / "_metadata").exists()
            check_tables(base, dead_letters, {f: {i: n for i, n in c.items() if i < 3} for f, c in landed.items()})
            continue
        assert run.state == "success", f"run {checkpoint_id} ended {run.state}"
        dead = check_tables(base, dead_letters, landed)  # 4: checkpoint 3's recovered by the trigger, once
        if checkpoint_id == 2:
            steps = [ti for ti in run.get_task_instances() if ti.task_id.startswith("step_")]
            assert all(ti.try_number == 2 for ti in steps), "every step died once before acking"

    per_checkpoint = {i: {uid: int((d.checkpoint_id == i).sum()) for uid, d in dead.items()} for i in range(1, 5)}
    assert all(sum(counts.values()) for counts in per_checkpoint.values()), "every checkpoint had dead letters"
    for i, counts in per_checkpoint.items():
        stats = json.loads((job_dir / "_stats" / f"{i}.json").read_text())
        assert stats["source_malformed"] == counts and stats["malformed_records"] == sum(counts.values())
        letters = {uid: stats["sinks"][f"{uid}.dead_letters"] for uid in counts}
        assert {uid: (e["kind"], e["rows"]) for uid, e in letters.items()} == {
            uid: ("dead_letters", n) for uid, n in counts.items()
        }
        assert {e["attempt"] for e in stats["steps"].values()} == {2 if i == 2 else 1}
        # checkpoint 3's finalize died after _metadata: run 4's trigger finished its commit
        committer = ("trigger", run_ids[4]) if i == 3 else ("finalize", run_ids[i])
        assert (stats["committed_by"], stats["committed_by_run_id"]) == committer
    code, out, _ = cli(capsys, "history", JOB, "--output", "json")
    rows = {r["checkpoint_id"]: r for r in json.loads(out)}
    assert code == 0 and {i: rows[i]["source_malformed"] for i in rows} == per_checkpoint
    code, out, _ = cli(capsys, "history", JOB, "--output", "yaml")  # the human cells, not cut to the terminal
    total = sum(per_checkpoint[4].values())
    assert code == 0 and f"{total} (clicks {per_checkpoint[4]['clicks']}, orders {per_checkpoint[4]['orders']})" in out
    storage = JobStorage.for_job(f"file://{tmp_path}/checkpoints", JOB)
    assert audit_job(storage, retained=3, sinks=module.pipeline.job.graph.sinks) == []
