"""A job with its own storage root, found everywhere: ``airflow checkpoints …`` and the restore DAG.

The example pipeline keeps its checkpoints under ``own-root/`` (``storage=``), not under
``[checkpoint] storage_root``; its trigger records that in the job registry. Every command runs through
Airflow's real CLI parser (the provider's ``cli`` key), one through the ``airflow``
executable; numbers are checked against the landed input, tables against pandas.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pandas as pd
import pytest

from airflow_provider_checkpoint.testing.clickstream import land_events, mismatches
from tests.airflow.conftest import cli

pytestmark = pytest.mark.airflow
JOB = "example_clickstream"


@pytest.fixture
def own_storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The example pipeline with ``storage=`` a root of its own (set before the DAG file is loaded)."""
    monkeypatch.setenv("CLICKSTREAM_STORAGE", f"file://{tmp_path}/own-root")
    return tmp_path / "own-root" / JOB


def tree(*roots: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for root in roots if root.exists() for p in root.rglob("*") if p.is_file()}


def test_job_with_its_own_storage_root(own_storage, example_dag, restore_dag, tmp_path, capsys):
    pipeline, own, default = example_dag.dag, own_storage, tmp_path / "checkpoints"
    landing = tmp_path / "clickstream" / "landing"
    landed = [land_events(landing, "e1.json", 120, 61)]
    assert pipeline.test().state == "success"
    landed.append(land_events(landing, "e2.json", 80, 62))
    assert pipeline.test().state == "success"
    assert (own / "chk-2" / "_metadata").exists() and not (default / JOB).exists()
    entry = json.loads((default / "_registry" / f"{JOB}.json").read_text())
    assert entry["storage_root"] == f"file://{tmp_path}/own-root" and entry["dag_id"] == JOB

    code, out, _ = cli(capsys, "list", "--output", "json")
    assert code == 0
    (job,) = [j for j in json.loads(out) if j["job_id"] == JOB]
    assert job["status"] == "RUNNING" and job["storage"] == f"file://{own}"
    assert job["latest_completed"]["checkpoint_id"] == 2

    code, out, _ = cli(capsys, "history", JOB, "--output", "json")
    rows = json.loads(out)
    assert code == 0 and [r["checkpoint_id"] for r in rows] == [2, 1]
    assert [r["records_in"] for r in rows] == [len(landed[1]), len(landed[0])]
    assert all(r["status"] == "COMPLETED" and r["duration_seconds"] > 0 for r in rows)
    code, out, _ = cli(capsys, "history", JOB, "--limit", "1")
    assert code == 0 and "next page: --offset 1" in out

    code, out, _ = cli(capsys, "show", JOB, "1", "--output", "json")
    detail = json.loads(out)
    assert code == 0 and detail["records_in"] == len(landed[0])
    assert detail["operators"]["page_views"]["rows"] == landed[0]["page"].nunique()
    assert cli(capsys, "show", JOB, "7")[0] == 2
    check_show(capsys, own, 1, detail)

    assert cli(capsys, "audit", JOB)[:2] == (0, f"job {JOB}: clean (file://{own})\n")
    # the sinks of the job's DAG are audited too: a link out of a table is named, not followed
    table = tmp_path / "clickstream" / "marts" / "page_views"
    outside = tmp_path / "outside"
    (outside / "x").mkdir(parents=True)
    (outside / "x" / "secret.parquet").write_bytes(b"not the table's")
    (table / "_staging").mkdir(exist_ok=True)
    (table / "_staging" / "link").symlink_to(outside)
    code, out, _ = cli(capsys, "audit", JOB)
    assert code == 3 and str(table / "_staging" / "link") in out and "secret.parquet" not in out, out
    (table / "_staging" / "link").unlink()
    assert cli(capsys, "audit", JOB)[0] == 0

    watched = (tmp_path / "own-root", default, tmp_path / "savepoints")
    before = tree(*watched)
    code, _, err = cli(capsys, "restore", JOB, "--checkpoint", "/etc")
    assert code == 2 and err.startswith("restore refused: path '/etc' is outside the allowed roots")
    code, _, err = cli(capsys, "restore", JOB, "--checkpoint", "9")
    assert code == 2 and err == f"restore refused: job {JOB} has no completed checkpoint 9 (retained: 1, 2)\n"
    code, out, _ = cli(capsys, "restore", JOB, "--checkpoint", "1", "--dry-run")
    assert code == 0 and out.startswith(f"dry run: job {JOB} can be restored from checkpoint 1")
    assert tree(*watched) == before, "refusals and dry runs write nothing"

    # the real executable: the provider's commands are registered, the exit code reaches the shell
    refused = subprocess.run(
        [sys.executable, "-m", "airflow", "checkpoints", "restore", JOB, "--checkpoint", "latest/../x"],
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2 and "restore refused: path 'latest/../x' must be absolute" in refused.stderr

    # the restore DAG finds the job under its own root
    conf = {"job_id": JOB, "checkpoint": "1", "trigger_pipeline": False}
    assert restore_dag.dag.test(run_conf=conf).state == "success"
    assert (own / "_restore.json").exists() and not (default / JOB).exists()
    landed.append(land_events(landing, "e3.json", 50, 63))
    assert pipeline.test().state == "success"
    meta = json.loads((own / "chk-3" / "_metadata").read_text())
    assert meta["restored_from"] == 1
    assert meta["stats"]["records_in"] == len(landed[1]) + len(landed[2]), "e2 replayed from checkpoint 1"
    assert mismatches(tmp_path / "clickstream" / "marts", pd.concat(landed)) == {}

    code, out, _ = cli(capsys, "history", JOB, "--output", "json", "--limit", "1")
    (latest,) = json.loads(out)
    assert latest["restored_from"] == 1 and latest["restored_from_url"] == f"file://{own}/chk-1"


def test_savepoint_command_triggers_a_run_with_the_trigger_form_conf(example_dag, tmp_path, capsys):
    from airflow.models import DagRun

    pipeline = example_dag.dag
    land_events(tmp_path / "clickstream" / "landing", "e1.json", 30, 71)
    assert pipeline.test().state == "success"  # also puts the DAG into the metadata DB
    runs = len(DagRun.find(dag_id=pipeline.dag_id))
    code, _, err = cli(capsys, "savepoint", pipeline.dag_id, "--dir", f"{tmp_path}/savepoints/../outside")
    assert code == 2 and err.startswith("savepoint_dir refused: path")
    code, out, _ = cli(capsys, "savepoint", pipeline.dag_id, "--stop")
    triggered = re.search(r"^triggered savepoint run (\S+) of DAG example_clickstream and stop the job;", out, re.M)
    assert code == 0 and triggered, out
    run_id = triggered.group(1)
    (run,) = DagRun.find(dag_id=pipeline.dag_id, run_id=run_id)
    assert run.conf == {"savepoint": True, "savepoint_dir": None, "stop_after_savepoint": True}
    assert len(DagRun.find(dag_id=pipeline.dag_id)) == runs + 1, "the refused savepoint triggered nothing"
    assert cli(capsys, "savepoint", "no_such_dag")[0] == 2


def check_show(capsys: pytest.CaptureFixture[str], job_dir: Path, checkpoint_id: int, detail: dict) -> None:
    """``show``'s JSON against the checkpoint's stats record and Airflow's task instances; its table
    with a line per step (its attempts) and per sink (never a ``{uid: n}`` map)."""
    record = json.loads((job_dir / "_stats" / f"{checkpoint_id}.json").read_text())
    steps = {s["step"]: s for s in detail["steps"]}
    assert (
        set(steps) == set(record["steps"]) and detail["metadata"] == f"file://{job_dir}/chk-{checkpoint_id}/_metadata"
    )
    assert detail["dag_run_url"] == f"/dags/{JOB}/runs/{quote(record['run_id'], safe='')}"
    for name, step in steps.items():
        assert [(a["try_number"], a["state"]) for a in step["attempts"]] == [(1, "success")], step
        assert all(a["duration"] is not None and a["end"] >= a["start"] for a in step["attempts"])
        assert (step["records_in"], step["seconds"]) == (
            record["steps"][name]["records_in"],
            record["steps"][name]["seconds"],
        )
        assert step["state_files"] == record["steps"][name].get("state_files")
    sinks = {"page_views_table", "user_totals_table", "events_archive"}
    assert {s["uid"] for s in detail["sinks"]} == sinks
    code, out, err = cli(capsys, "show", JOB, str(checkpoint_id))
    assert code == 0, err
    table = out.split("\nsinks:")[1].split("\noperators")[0]
    for uid in sinks:
        (line,) = [line for line in table.splitlines() if uid in line]
        assert "{" not in line, line
    for name in steps:
        (line,) = [line for line in out.split("\nsteps:")[1].split("\nsinks:")[0].splitlines() if name in line]
        assert "1 success" in line, line
