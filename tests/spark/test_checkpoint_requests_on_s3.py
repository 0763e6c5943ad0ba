"""A whole small checkpoint on a real S3 server (SeaweedFS, every request logged): trigger, the step
(FileSource → KeyedAggregate → ParquetTableSink upsert and DeltaTableSink append) and finalize make at
most :data:`REQUESTS` requests, the same number late as early, and the table holds what pandas computes.

The budget is the count of ``scripts/bench/objectstore.py``'s small pipeline in one process (that
benchmark runs each checkpoint in a fresh process, which adds the first-contact ``HeadBucket``);
docs/benchmarks.md lists each request. A change that adds a request fails here: take it out, or
raise the budget there and here with the reason.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from airflow_provider_checkpoint.coordinator import CheckpointCoordinator
from airflow_provider_checkpoint.core.settings import CheckpointSettings
from airflow_provider_checkpoint.dataflow import DeltaTableSink, FileSource, KeyedAggregate, ParquetTableSink
from airflow_provider_checkpoint.dataflow.graph import collecting
from airflow_provider_checkpoint.dataflow.planner import PipelineGraph
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.testing.inprocess import Job
from tests.s3.s3_job import s3fs_of
from tests.servers.s3 import AccessLog, S3Server
from tests.spark.helpers import staged_and_committed, step_context

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

REQUESTS = 72
"""Requests of each of checkpoints 2 to 4 of the small pipeline: at most this (checkpoint 4 makes the most;
one of them the ranged read of a bucket file's footer, the upsert step's column check)."""
SCHEMA = "user STRING, page STRING, ts LONG"
AGGS = {"events": "count", "first_seen": "min(ts)", "last_seen": "max(ts)"}


def events(checkpoint: int) -> pd.DataFrame:
    """Increment ``checkpoint``: 300 events of 200 users (every bucket of the upsert table changes)."""
    rng = random.Random(checkpoint)
    return pd.DataFrame(
        {
            "user": [f"u{rng.randrange(200):03d}" for _ in range(300)],
            "page": [f"p{rng.randrange(9)}" for _ in range(300)],
            "ts": [1_700_000_000_000 + 1000 * checkpoint + i for i in range(300)],
        }
    )


def _logged(logged_s3: tuple[S3Server, AccessLog], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The logged server's environment set, and its storage options: given too, not only its environment (fsspec
    reuses a filesystem made with the same arguments, which in this process may reach the session's other S3
    server)."""
    for name, value in logged_s3[0].env().items():
        monkeypatch.setenv(name, value)
    return logged_s3[0].storage_options()


def test_a_small_checkpoint_on_s3_makes_few_requests_and_no_more_as_the_job_ages(
    spark: SparkSession, logged_s3: tuple[S3Server, AccessLog], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, access = logged_s3
    options = _logged(logged_s3, monkeypatch)
    root = server.url(f"small-{uuid.uuid4().hex[:8]}")
    with collecting() as nodes:
        landing = FileSource("events", f"{root}/landing", "json", SCHEMA, storage_options=options)
        totals = KeyedAggregate("totals", landing, ["user"], AGGS)
        ParquetTableSink("table", totals, f"{root}/parquet", "upsert", ["user"], storage_options=options)
        DeltaTableSink("delta", totals, f"{root}/delta", "append", storage_options=options)
    graph = PipelineGraph(nodes)
    storage = JobStorage.for_job(f"{root}/checkpoints", "job", **options)
    coordinator = CheckpointCoordinator(storage, graph, CheckpointSettings(retained_checkpoints=3), None, None)
    job = Job(spark, tmp_path, graph, storage, coordinator)
    fs = s3fs_of(server)
    landed = []
    counts = {}
    for checkpoint in range(1, 5):
        landed.append(events(checkpoint))
        fs.pipe_file(
            f"{root.removeprefix('s3://')}/landing/inc-{checkpoint}.json",
            landed[-1].to_json(orient="records", lines=True).encode(),
        )
        access.since()
        job.checkpoint()
        # the server may log the PUT that landed the input after the window opened: the job puts nothing there
        counts[checkpoint] = sum(not (r.kind == "PUT" and "/landing/" in r.path) for r in access.since())
    by_user = pd.concat(landed).groupby("user")
    truth = by_user.agg(events=("ts", "size"), first_seen=("ts", "min"), last_seen=("ts", "max"))
    table = ds.dataset(f"{root.removeprefix('s3://')}/parquet", format="parquet", filesystem=fs).to_table().to_pandas()
    got = table.set_index("user")[list(truth.columns)].sort_index()
    pd.testing.assert_frame_equal(got, truth.sort_index(), check_dtype=False)
    late = [counts[c] for c in (2, 3, 4)]
    assert max(late) <= REQUESTS, counts
    # checkpoint 3 reads one more kept state delta than 2, checkpoint 4 two more, and its retention has
    # a first checkpoint to delete (one bulk request): nothing else grows with the job's age
    assert counts[4] - counts[2] <= 3, counts


UPSERT_STEP_REQUESTS = 20
"""Requests of a Delta upsert step changing 2 keys of a 16-bucket table (its prepared stage, then the stage): at
most this. Measured 17: the log (listing, ``_last_checkpoint``, log checkpoint), its replay, the claim, the
staging listings, the update file and DV file written, and the key columns of the one bucket file both keys
hash to. A preparation reading the key columns of all 16 bucket files made 32."""


def test_a_small_delta_upsert_on_s3_reads_only_the_files_its_changed_keys_can_be_in(
    spark: SparkSession, logged_s3: tuple[S3Server, AccessLog], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deltalake import DeltaTable

    server, access = logged_s3
    options = _logged(logged_s3, monkeypatch)
    url = f"{server.url(f'upsert-{uuid.uuid4().hex[:8]}')}/delta"
    source = FileSource("events", str(tmp_path / "none"), "json", "user STRING, v LONG")
    sink = DeltaTableSink("delta", source, url, "upsert", ["user"], buckets=16, storage_options=options)
    storage = JobStorage.for_job(str(tmp_path / "checkpoints"), "job")
    first = pd.DataFrame({"user": [f"u{i:04d}" for i in range(2000)], "v": range(2000)})
    staged_and_committed(spark, sink, storage, 1, first, "user STRING, v LONG")
    changed = pd.DataFrame({"user": ["u0007", "u1234"], "v": [-7, -1234]})
    df = spark.createDataFrame(changed, "user STRING, v LONG")
    ctx = step_context(spark, storage, 2)
    access.since()
    sink.prepare(ctx)
    committables = sink.stage(ctx, df)
    step = access.since()
    sink.commit(2, committables)
    model = dict(zip(first.user, first.v, strict=True)) | dict(zip(changed.user, changed.v, strict=True))
    got = pa.table(DeltaTable(url, storage_options=sink.delta_options()).scan()).to_pylist()  # DVs applied
    assert {r["user"]: r["v"] for r in got} == model and len(got) == len(model)
    assert len(step) <= UPSERT_STEP_REQUESTS, Counter(r.kind for r in step)
