"""Helpers of the S3 tests: a job of the unit tests' pipeline (:mod:`tests.unit.helpers`) whose storage
root is on the S3 server (landing directory and table local, state files on S3), and click events
landed on S3 with their tables compared to the pandas ground truth.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.dataset as ds

from airflow_provider_checkpoint.coordinator import CheckpointCoordinator
from airflow_provider_checkpoint.core.model import Ack, CheckpointPlan
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.storage.job_storage import Location
from airflow_provider_checkpoint.testing.clickstream import TABLES, expected_tables, land_events, normalized
from tests.servers.s3 import S3Server
from tests.unit.helpers import Env, make_ack, state_rel


def coordinator_on(env: Env, storage: JobStorage, *allowed_roots: str) -> CheckpointCoordinator:
    """``env``'s pipeline and settings on ``storage``; savepoints may also go under ``allowed_roots``."""
    roots = [storage.url().rsplit("/", 1)[0], *allowed_roots] if allowed_roots else None
    return CheckpointCoordinator(storage, env.coordinator.graph, env.coordinator.settings, None, roots)


def s3_ack(env: Env, storage: JobStorage, plan: CheckpointPlan) -> Ack:
    """The ack of a step attempt whose state file was written to ``storage``."""
    ack = make_ack(env, plan)
    rel = state_rel(plan.checkpoint_id, 1)
    storage.write_atomic(rel, (env.job_dir / rel).read_bytes())
    return ack


@contextmanager
def counted_requests(storage: Location) -> Iterator[Counter[str]]:
    """Count the S3 API calls ``storage``'s real client makes (botocore's own event hooks): a job's
    storage, or a sink's table directory (``sink.table()``, the same client as the sink's)."""
    storage.fs.connect()
    events = storage.fs.s3.meta.events
    counts: Counter[str] = Counter()

    def count(model: Any, **_: Any) -> None:
        counts[model.name] += 1

    events.register("before-call.s3", count)
    try:
        yield counts
    finally:
        events.unregister("before-call.s3", count)


def s3fs_of(server: S3Server):  # type: ignore[no-untyped-def]
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False, **server.storage_options())


def delta_reader(server: S3Server) -> Callable[[str], pd.DataFrame]:
    """A Delta table on ``server`` (``bucket/path``) as delta-rs's ``scan()`` reads it (deletion vectors
    applied), with options this test gives delta-rs itself."""
    import pyarrow as pa
    from deltalake import DeltaTable

    options = {
        "aws_access_key_id": server.key,
        "aws_secret_access_key": server.secret,
        "aws_endpoint_url": server.endpoint,
        "aws_allow_http": "true",
    }
    return lambda path: pa.table(DeltaTable(f"s3://{path}", storage_options=options).scan()).to_pandas()


def land(fs, local: Path, landing: str, name: str, n: int, seed: int) -> pd.DataFrame:  # type: ignore[no-untyped-def]
    """``n`` events written locally, then put on S3 under ``landing`` in one PUT (complete or absent)."""
    events = land_events(local, name, n, seed)
    fs.put_file(str(local / name), f"{landing}/{name}")
    return events


def table_mismatches(  # type: ignore[no-untyped-def]
    fs,
    marts: str,
    events: pd.DataFrame,
    tables: tuple[str, ...] = TABLES,
    read: Callable[[str], pd.DataFrame] | None = None,
) -> dict[str, str]:
    """Each of ``tables`` under ``marts`` as ``read`` gets it (default: its Parquet files as pyarrow reads them from
    S3, hidden files ignored) vs the pandas ground truth."""
    out = {}
    for table, truth in expected_tables(events).items():
        if table not in tables:
            continue
        path = f"{marts}/{table}"
        got = read(path) if read else ds.dataset(path, format="parquet", filesystem=fs).to_table().to_pandas()
        try:
            pd.testing.assert_frame_equal(normalized(got, table), normalized(truth, table))
        except AssertionError as e:
            out[table] = f"{len(got)} rows vs {len(truth)}: {str(e).splitlines()[0]}"
    return out
