"""The clickstream example's data on the S3 server: landing events there and checking its tables against pandas."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.dataset as ds
import pytest

from airflow_provider_checkpoint.testing.clickstream import expected_tables, land_events, normalized
from tests.conftest import REPO
from tests.servers.s3 import S3Server

JOB = "s3_clickstream"


def s3_clickstream_source() -> str:
    """The clickstream example as DAG ``s3_clickstream`` keeping every state in files (no inline state)."""
    source = (REPO / "dags" / "example_clickstream.py").read_text()
    for old, new in (
        ('dag_id="example_clickstream"', f'dag_id="{JOB}"'),
        ("retained_checkpoints=3,", "retained_checkpoints=3, inline_state_threshold=0,"),
    ):
        assert old in source, old
        source = source.replace(old, new)
    return source


def everything_on_s3(server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """Landing area, tables (``CLICKSTREAM_DIR``), storage root and savepoint root under a fresh prefix of
    ``server``, credentials in the standard AWS environment only; the prefix's ``s3://`` URL.
    """
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    prefix = server.url(f"pipeline-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("CLICKSTREAM_DIR", f"{prefix}/clickstream")
    monkeypatch.setenv("AIRFLOW__CHECKPOINT__STORAGE_ROOT", f"{prefix}/checkpoints")
    monkeypatch.setenv("AIRFLOW__CHECKPOINT__SAVEPOINT_ROOTS", f"{prefix}/savepoints")
    monkeypatch.delenv("CHECKPOINT_FAULTS", raising=False)
    return prefix


def s3fs_of(server: S3Server) -> Any:
    """A fresh ``s3fs`` filesystem reaching ``server`` (no instance or listings cache)."""
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False, **server.storage_options())


def land(fs: Any, local: Path, landing: str, name: str, n: int, seed: int) -> pd.DataFrame:
    """``n`` events written locally, then put on S3 under ``landing`` in one PUT (complete or absent)."""
    events = land_events(local, name, n, seed)
    fs.put_file(str(local / name), f"{landing}/{name}")
    return events


def table_mismatches(fs: Any, marts: str, events: pd.DataFrame) -> dict[str, str]:
    """Each table as pyarrow reads it from S3 (hidden files ignored) vs the pandas ground truth."""
    out = {}
    for table, truth in expected_tables(events).items():
        got = ds.dataset(f"{marts}/{table}", format="parquet", filesystem=fs).to_table().to_pandas()
        try:
            pd.testing.assert_frame_equal(normalized(got, table), normalized(truth, table))
        except AssertionError as e:
            out[table] = f"{len(got)} rows vs {len(truth)}: {str(e).splitlines()[0]}"
    return out
