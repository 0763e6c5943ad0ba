"""The clickstream example as a DAG whose landing area, tables, storage root and savepoints are on the S3 server."""

from __future__ import annotations

import uuid

import pytest

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
