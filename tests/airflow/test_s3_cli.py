"""``airflow checkpoints list/show/history`` read a job whose storage root is on the S3 server.

The checkpoints are made by the coordinator (no Spark: the step's files are written as a
step would); credentials and endpoint come from the standard AWS environment only.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from airflow_provider_checkpoint.storage import JobStorage
from tests.airflow.conftest import cli
from tests.s3.s3_job import coordinator_on, s3_ack
from tests.servers.s3 import S3Server
from tests.unit.helpers import JOB, T0, make_env

pytestmark = pytest.mark.airflow


def test_cli_reads_a_job_on_s3(airflow_db, tmp_path: Path, s3_server: S3Server, monkeypatch, capsys) -> None:
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    root = s3_server.url(f"cli-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("AIRFLOW__CHECKPOINT__STORAGE_ROOT", root)
    env = make_env(tmp_path)
    coordinator = coordinator_on(env, JobStorage.for_job(root, JOB))
    for checkpoint_id in (1, 2):
        plan = coordinator.trigger(f"run-{checkpoint_id}", now=T0 + 10 * checkpoint_id)
        assert plan.checkpoint_id == checkpoint_id
        coordinator.finalize(plan, [s3_ack(env, coordinator.storage, plan)], now=T0 + 10 * checkpoint_id + 1)

    code, out, err = cli(capsys, "list", "--output", "json")
    assert code == 0, err
    (job,) = [j for j in json.loads(out) if j["job_id"] == JOB]
    assert job["storage"] == f"{root}/{JOB}" and job["latest_completed"]["checkpoint_id"] == 2

    code, out, err = cli(capsys, "history", JOB, "--output", "json")
    assert code == 0, err
    assert [(r["checkpoint_id"], r["status"]) for r in json.loads(out)] == [(2, "COMPLETED"), (1, "COMPLETED")]

    code, out, err = cli(capsys, "show", JOB, "1", "--output", "json")
    assert code == 0, err
    detail = json.loads(out)
    assert detail["metadata"] == f"{root}/{JOB}/chk-1/_metadata"
    assert detail["operators"]["counts"]["files"] == 1 and [s["uid"] for s in detail["sinks"]] == ["table"]
    assert s3_server.secret not in out + err
