"""Storage root, file source, Parquet and Delta sinks on S3 with credentials only from an Airflow ``aws`` connection.

The environment holds no AWS credentials and no endpoint: the connection, defined as a user
would (``AIRFLOW_CONN_<ID>``: login, password, extra ``endpoint_url``), is the only way to the
server, which enforces credentials. Two checkpoints driven as the operators drive them
(trigger → run_step → finalize) on a local SparkSession without Hadoop's S3 filesystem: the
executors read the source files, write the state files and stage the sink files through the
filesystem pickled into their tasks; delta-rs commits the Delta tables with options derived from
the same connection. The tables are compared with a pandas ground truth.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import uuid
from pathlib import Path

import pandas as pd
import pytest

from airflow_provider_checkpoint.coordinator import CheckpointCoordinator
from airflow_provider_checkpoint.core.model import CheckpointType
from airflow_provider_checkpoint.core.settings import CheckpointSettings
from airflow_provider_checkpoint.core.status import AbortReason
from airflow_provider_checkpoint.dataflow import (
    DeltaSource,
    DeltaTableSink,
    FileSource,
    KeyedAggregate,
    ParquetTableSink,
    PipelineGraph,
)
from airflow_provider_checkpoint.exceptions import CheckpointStorageError, RefusedInputError
from airflow_provider_checkpoint.restore.requests import read_state, request_restore
from airflow_provider_checkpoint.spark.runner import run_step
from airflow_provider_checkpoint.storage import Location
from airflow_provider_checkpoint.storage.config import job_storage
from airflow_provider_checkpoint.storage.job_records import JobRecordStore
from airflow_provider_checkpoint.storage.object_store import for_executors
from airflow_provider_checkpoint.testing.clickstream import expected_tables
from tests.s3.s3_job import delta_reader, land, s3fs_of, table_mismatches
from tests.servers.s3 import S3Server
from tests.spark.conftest import spark  # noqa: F401 - a fixture

pytestmark = pytest.mark.spark


def define_connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, server: S3Server, password: str) -> None:
    """An ``aws`` connection to ``server`` as ``AIRFLOW_CONN_<ID>`` JSON; every ``AWS_*`` variable removed."""
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    conn = {"conn_type": "aws", "login": server.key, "password": password, "extra": {"endpoint_url": server.endpoint}}
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))


def test_pipeline_on_s3_through_an_aws_connection_only(
    spark,  # noqa: F811 - the fixture
    s3_server: S3Server,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    define_connection(monkeypatch, "s3_lake", s3_server, s3_server.secret)
    caplog.set_level(logging.INFO)
    prefix = f"{s3_server.bucket}/conn-{uuid.uuid4().hex[:8]}"
    landing, marts = f"{prefix}/landing", f"{prefix}/marts"
    via_connection = {"conn_id": "s3_lake"}
    events = FileSource(
        "events", f"s3://{landing}", "json", "user STRING, page STRING, ts LONG", storage_options=via_connection
    )
    totals = KeyedAggregate(
        "user_totals", events, keys=["user"], aggs={"events": "count", "first_seen": "min(ts)", "last_seen": "max(ts)"}
    )
    on_lake = {"storage_options": via_connection, "step": "main"}
    delta = f"{prefix}/delta"
    sinks = [
        ParquetTableSink("user_totals_table", totals, f"s3://{marts}/user_totals", "upsert", ["user"], **on_lake),
        ParquetTableSink("events_table", events, f"s3://{marts}/events", "append", **on_lake),
        DeltaTableSink(
            "user_totals_delta", totals, f"s3://{delta}/user_totals", "upsert", ["user"], buckets=4, **on_lake
        ),
        DeltaTableSink("events_delta", events, f"s3://{delta}/events", "append", **on_lake),
    ]
    graph = PipelineGraph([events, totals, *sinks])
    storage = job_storage("job", f"s3://{prefix}/checkpoints", "s3_lake")
    shipped = pickle.loads(pickle.dumps(for_executors(storage.fs))).storage_options
    assert (shipped["key"], shipped["endpoint_url"]) == (s3_server.key, s3_server.endpoint)
    settings = CheckpointSettings(retained_checkpoints=2, inline_state_threshold=0)
    coordinator = CheckpointCoordinator(storage, graph, settings, None, [storage.url(), f"s3://{prefix}/savepoints"])
    fs = s3fs_of(s3_server)  # the test's own client, to land files and read the tables
    landed: list[pd.DataFrame] = []

    def checkpoint(land_seed: int | None, kind: CheckpointType = CheckpointType.CHECKPOINT, **options: str) -> None:
        if land_seed is not None:
            landed.append(land(fs, tmp_path, landing, f"e{land_seed}.json", 40 * land_seed, land_seed))
        plan = coordinator.trigger(
            f"run-{JobRecordStore(storage).load().last_checkpoint_id + 1}", kind, options=options
        )
        acks = [run_step(spark, storage, graph, step, plan, 1, {}, coordinator.settings) for step in plan.steps]
        coordinator.finalize(plan, acks)
        assert table_mismatches(fs, marts, pd.concat(landed), ("user_totals", "events")) == {}
        assert table_mismatches(fs, delta, pd.concat(landed), ("user_totals", "events"), delta_reader(s3_server)) == {}

    checkpoint(1)
    checkpoint(2)
    # a Delta source on S3 reads the upsert table's files through the executors' filesystem
    upserted = DeltaSource("read", f"s3://{delta}/user_totals", storage_options=via_connection).read_version(spark)
    rows = upserted.toPandas()
    assert table_mismatches(fs, delta, pd.concat(landed), ("user_totals",), lambda _: rows) == {}
    meta = json.loads(fs.cat_file(f"{prefix}/checkpoints/job/chk-2/_metadata"))
    state_files = [h for op in meta["operators"].values() for h in op["handles"]]
    assert state_files and all(fs.size(f"{prefix}/checkpoints/job/{h['path']}") == h["size"] for h in state_files)
    # a savepoint beside the storage takes its connection; a restore from it reads its state on the executors
    savepoint = f"s3://{prefix}/savepoints/sp-3"
    checkpoint(None, CheckpointType.SAVEPOINT, savepoint_target=savepoint)
    assert fs.exists(f"{prefix}/savepoints/sp-3/_metadata")
    # read_state reads it through the connection: the user totals of everything landed so far
    state = read_state(savepoint, "user_totals", conn_id="s3_lake").to_pandas()
    want = expected_tables(pd.concat(landed))["user_totals"].sort_values("user").reset_index(drop=True)
    got = state[want.columns.tolist()].sort_values("user").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    request_restore(storage, savepoint, allow_non_restored_state=False, dry_run=False)
    checkpoint(4)
    assert json.loads(fs.cat_file(f"{prefix}/checkpoints/job/chk-4/_metadata"))["restored_from"] == 3
    out, err = capfd.readouterr()
    assert s3_server.secret not in caplog.text + out + err
    stored = [p for p in fs.find(prefix) if "/landing/" not in p]
    assert stored and not [p for p in stored if s3_server.secret.encode() in fs.cat_file(p)]


def test_wrong_password_names_the_connection_not_the_secret(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = f"not-the-secret-{uuid.uuid4().hex}"
    define_connection(monkeypatch, "s3_wrong", s3_server, wrong)
    url = s3_server.url("root")
    with pytest.raises(CheckpointStorageError, match="denied.*Airflow connection 's3_wrong'") as info:
        job_storage("job", url, "s3_wrong")
    assert url in str(info.value) and wrong not in str(info.value)


def test_a_connection_that_is_not_defined_or_not_aws_is_named(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(CheckpointStorageError, match="Airflow connection 's3_missing' is not defined"):
        job_storage("job", s3_server.url("root"), "s3_missing")
    monkeypatch.setenv("AIRFLOW_CONN_S3_HTTP", json.dumps({"conn_type": "http", "host": "example.org"}))
    with pytest.raises(CheckpointStorageError, match="Airflow connection 's3_http' has type 'http', not 'aws'"):
        job_storage("job", s3_server.url("root"), "s3_http")


def test_conn_id_is_refused_where_no_connection_applies(tmp_path: Path) -> None:
    with pytest.raises(RefusedInputError, match="conn_id='s3_lake' applies to s3:// locations .*not file://"):
        Location.from_url(f"file://{tmp_path}", conn_id="s3_lake")
    on_disk = {"storage_options": {"conn_id": "s3_lake"}}
    source = DeltaSource("changes", f"file://{tmp_path}/t", **on_disk)
    for delta in (source, DeltaTableSink("table", source, f"file://{tmp_path}/u", **on_disk)):
        with pytest.raises(RefusedInputError, match="conn_id='s3_lake' applies to s3:// locations .*not file://"):
            delta._fs()


@pytest.mark.parametrize("kind", ["parquet", "delta"])
def test_a_sink_in_a_missing_bucket_is_named_with_the_fix(
    spark,  # noqa: F811 - the fixture
    s3_server: S3Server,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
) -> None:
    """The step names the table's URL, the missing bucket and the fix; so does the abort that follows
    if it has anything to do there (a Delta table that does not exist has nothing to delete)."""
    define_connection(monkeypatch, "s3_lake", s3_server, s3_server.secret)
    (tmp_path / "landing").mkdir()
    (tmp_path / "landing" / "e1.json").write_text('{"user": "u1", "ts": 1}\n')
    events = FileSource("events", f"file://{tmp_path}/landing", "json", "user STRING, ts LONG")
    table = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/marts/events"
    sink_class = ParquetTableSink if kind == "parquet" else DeltaTableSink
    sink = sink_class("events_table", events, table, "append", storage_options={"conn_id": "s3_lake"}, step="main")
    graph = PipelineGraph([events, sink])
    storage = job_storage("job", f"file://{tmp_path}/checkpoints")
    coordinator = CheckpointCoordinator(storage, graph, CheckpointSettings(), None, [storage.url()])
    plan = coordinator.trigger("run-1", CheckpointType.CHECKPOINT)
    fix = rf"bucket 'no-such-bucket-\w+' of {table} does not exist: create it first"
    with pytest.raises(CheckpointStorageError, match=fix):
        run_step(spark, storage, graph, plan.steps[0], plan, 1, {}, coordinator.settings)
    try:
        coordinator.abort(plan, AbortReason.DECLINED, "the step failed")
    except CheckpointStorageError as e:
        assert re.search(fix, str(e)), e
    else:
        assert kind == "delta", "the Parquet sink's abort deletes its staging directory in the bucket"
