"""The example clickstream pipeline with everything on the S3 server: landing area, tables, storage root, savepoints.

Real Airflow (``dag.test()``), a local SparkSession whose Hadoop layer has no S3 filesystem:
every file the executors read or write (source files, state, staged sink files) goes
through the Python file engine (:mod:`~airflow_provider_checkpoint.fileio.writes`).
Credentials come from the standard AWS environment only. Tables are compared with a
pandas ground truth over all input landed, after a step retry and after a restore.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pandas as pd
import pytest

from tests.airflow.conftest import airflow_db, load_dag_module, own_dags_folder  # noqa: F401 - a fixture
from tests.conftest import REPO
from tests.s3.clickstream_s3 import JOB, everything_on_s3, s3_clickstream_source
from tests.s3.s3_job import land, s3fs_of, table_mismatches
from tests.servers.s3 import S3Server

pytestmark = pytest.mark.airflow


@pytest.mark.usefixtures("airflow_db")
def test_clickstream_on_s3_is_exactly_once_through_a_retry_and_a_restore(
    tmp_path: Path, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, caplog, capfd
) -> None:
    prefix = everything_on_s3(s3_server, monkeypatch)
    pipeline = own_dags_folder(tmp_path, monkeypatch, JOB, s3_clickstream_source()).dag
    restore = load_dag_module(REPO / "dags" / "restore_from_checkpoint.py").dag
    fs = s3fs_of(s3_server)
    bucket_path = prefix.removeprefix("s3://")
    landing, marts = f"{bucket_path}/clickstream/landing", f"{bucket_path}/clickstream/marts"
    job = f"{bucket_path}/checkpoints/{JOB}"
    caplog.set_level(logging.INFO)

    landed = [land(fs, tmp_path / "local", landing, "e1.json", 300, 1)]
    assert pipeline.test().state == "success"
    assert table_mismatches(fs, marts, pd.concat(landed)) == {}

    # checkpoint 2: the page-views step dies before acking on its first attempt and is retried
    landed.append(land(fs, tmp_path / "local", landing, "e2.json", 200, 2))
    monkeypatch.setenv("CHECKPOINT_FAULTS", "step.before_ack:checkpoint=2:attempt=1:step=step_page_views_table")
    assert pipeline.test().state == "success"
    monkeypatch.delenv("CHECKPOINT_FAULTS")
    assert table_mismatches(fs, marts, pd.concat(landed)) == {}
    meta = json.loads(fs.cat_file(f"{job}/chk-2/_metadata"))
    state_files = [h for op in meta["operators"].values() for h in op["handles"]]
    assert state_files and all(fs.size(f"{job}/{h['path']}") == h["size"] for h in state_files)

    landed.append(land(fs, tmp_path / "local", landing, "e3.json", 250, 3))
    assert pipeline.test().state == "success"
    assert table_mismatches(fs, marts, pd.concat(landed)) == {}

    # restore checkpoint 1: the next checkpoint replays e2 and e3 from its positions, once
    conf = {"job_id": JOB, "checkpoint": "1", "trigger_pipeline": False}
    assert restore.test(run_conf=conf).state == "success"
    landed.append(land(fs, tmp_path / "local", landing, "e4.json", 150, 4))
    assert pipeline.test().state == "success"
    meta = json.loads(fs.cat_file(f"{job}/chk-4/_metadata"))
    assert meta["restored_from"] == 1 and meta["stats"]["records_in"] == 600
    assert table_mismatches(fs, marts, pd.concat(landed)) == {}

    out, err = capfd.readouterr()
    assert s3_server.secret not in caplog.text + out + err
    documents = [p for p in fs.find(bucket_path) if not p.endswith(".parquet") and "/landing/" not in p]
    assert documents and not [p for p in documents if s3_server.secret.encode() in fs.cat_file(p)]
