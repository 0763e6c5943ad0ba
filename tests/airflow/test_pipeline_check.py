"""The pipeline check through real Airflow (``dag.test()``), real local Spark and ``airflow checkpoints check``.

Two versions of one pipeline DAG (``CHECK_VERSION`` picks its transform): the first selects a column its
source does not declare. Its trigger refuses the run before an id is allocated: no checkpoint
directory, no staged or committed row, no failure counted. The second passes, is recorded in the job
record and not checked again by its next run (the check's runs are counted by a spy around the real
check). The CLI reports the same problem, with exit code 3, and 0 for the good version.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd
import pytest

from airflow_provider_checkpoint.dataflow.version import pipeline_version
from airflow_provider_checkpoint.pipeline import TRIGGER_TASK_ID
from airflow_provider_checkpoint.spark import dry_run
from tests.airflow.conftest import cli, load_dag_module, own_dags_folder
from tests.spark.helpers import table, write_json

pytestmark = pytest.mark.airflow
DAG_ID = "checked_pipeline"

CHECKED_DAG = """
import os
from pathlib import Path

from airflow_provider_checkpoint import CheckpointedPipeline, FileSource, ParquetTableSink, Transform

BASE = Path(os.environ["CHECKED_DIR"])
COLUMN = {"bad": "usr", "good": "user"}[os.environ["CHECK_VERSION"]]
with CheckpointedPipeline(dag_id="checked_pipeline", schedule=None, step_retries=0) as pipeline:
    events = FileSource(uid="events", path=str(BASE / "landing"), format="json", schema="user STRING, ts LONG")
    picked = Transform(uid="pick", input=events, fn=lambda df: df.select(COLUMN, "ts"))
    ParquetTableSink(uid="picked_table", input=picked, path=str(BASE / "picked"))
dag = pipeline.dag
"""


@pytest.fixture
def checked(airflow_db: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The DAG file in a DAGs folder of its own, its data and checkpoints under ``tmp_path``; ``CHECK_VERSION=bad``."""
    monkeypatch.setenv("CHECKED_DIR", str(tmp_path / "checked"))
    monkeypatch.setenv("CHECK_VERSION", "bad")
    monkeypatch.setenv("AIRFLOW__CHECKPOINT__STORAGE_ROOT", f"file://{tmp_path}/checkpoints")
    own_dags_folder(tmp_path, monkeypatch, "checked", CHECKED_DAG)
    yield tmp_path / "dags" / "checked.py"


@pytest.fixture
def check_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The job id of every run of the real check (a spy: the check itself runs unchanged)."""
    runs: list[str] = []
    real = dry_run.check_graph

    def counted(spark: Any, graph: Any, job_id: str) -> list[dry_run.Problem]:
        runs.append(job_id)
        return real(spark, graph, job_id)

    monkeypatch.setattr(dry_run, "check_graph", counted)
    return runs


def _version(path: Path, monkeypatch: pytest.MonkeyPatch, which: str) -> ModuleType:
    monkeypatch.setenv("CHECK_VERSION", which)
    return load_dag_module(path)


def test_a_bad_version_is_refused_before_any_write_and_a_good_one_is_checked_once(
    checked, check_runs, tmp_path, monkeypatch, caplog
):
    base, job_dir = tmp_path / "checked", tmp_path / "checkpoints" / DAG_ID
    rows = [{"user": f"u{i}", "ts": i} for i in range(5)]
    write_json(base / "landing" / "a.json", rows)

    bad = _version(checked, monkeypatch, "bad")
    run = bad.dag.test()
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert run.state == "failed" and states[TRIGGER_TASK_ID] == "failed", states
    assert all(state != "success" for task, state in states.items() if task != TRIGGER_TASK_ID)
    assert check_runs == [DAG_ID]
    refusals = [r.getMessage() for r in caplog.records if "pipeline check" in r.getMessage()]
    assert any("pick: AnalysisException [UNRESOLVED_COLUMN" in m and "`usr`" in m for m in refusals), refusals
    # no id allocated, no failure counted (no job record at all), nothing planned, staged or written, no lease left
    assert sorted(p.name for p in job_dir.iterdir()) == [] and not (base / "picked").exists()

    good = _version(checked, monkeypatch, "good")  # the transform reads another COLUMN: a new version
    assert pipeline_version(good.pipeline.job.graph) != pipeline_version(bad.pipeline.job.graph)
    assert good.dag.test().state == "success"
    assert check_runs == [DAG_ID, DAG_ID]
    assert json.loads((job_dir / "_job.json").read_text())["checked_version"] == pipeline_version(
        good.pipeline.job.graph
    )
    write_json(base / "landing" / "b.json", [{"user": "u9", "ts": 9}])
    assert good.dag.test().state == "success"
    assert check_runs == [DAG_ID, DAG_ID]  # the version passed: its next run is not checked again
    landed = pd.DataFrame([*rows, {"user": "u9", "ts": 9}])
    got = table(base / "picked").sort_values("ts").reset_index(drop=True)
    pd.testing.assert_frame_equal(got[["user", "ts"]], landed, check_dtype=False)


def test_the_check_command_reports_each_problem_with_its_node_and_fix(checked, check_runs, monkeypatch, capsys):
    code, out, _ = cli(capsys, "check", DAG_ID)
    assert (
        code == 3
        and "pick: AnalysisException [UNRESOLVED_COLUMN" in out
        and "(fix: make the transform's function" in out
    ), out
    assert f"DAG {DAG_ID} (job {DAG_ID}), version " in out and ": 1 problem(s)" in out

    monkeypatch.setenv("CHECK_VERSION", "good")
    code, out, _ = cli(capsys, "check", DAG_ID, "-B", "checked", "--dagfile-path", str(checked))
    assert code == 0 and out.rstrip().endswith("passes the pipeline check"), out
    assert check_runs == [DAG_ID, DAG_ID]
    code, _, err = cli(capsys, "check", "no_such_dag")
    assert code == 2 and "check refused" in err and "no_such_dag" in err

    # -o json: the report as one document (in this process Airflow's parsing logs reach the captured stdout
    # too; the airflow executable sends them to stderr, as for every command)
    monkeypatch.setenv("CHECK_VERSION", "bad")
    code, out, _ = cli(capsys, "check", DAG_ID, "-o", "json")
    report = json.loads(out[out.index("{\n") :])
    assert code == 3 and report["dag_id"] == DAG_ID and report["job_id"] == DAG_ID and len(report["version"]) == 16
    (problem,) = report["problems"]
    assert problem["uid"] == "pick" and problem["message"].startswith("AnalysisException [UNRESOLVED_COLUMN")
    assert "events <user:string,ts:bigint>" in problem["fix"]
