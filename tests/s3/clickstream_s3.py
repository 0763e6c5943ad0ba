"""The clickstream example as a DAG whose landing area, tables, storage root and savepoints are on the S3 server."""

from __future__ import annotations

import uuid

import pytest

from tests.conftest import REPO
from tests.servers.s3 import S3Server

JOB = "s3_clickstream"


ONE_STEP = "main"
"""The step of every sink when the pipeline runs in one step."""


def s3_clickstream_source(one_step: bool = False) -> str:
    """The clickstream example as DAG ``s3_clickstream`` keeping every state in files (no inline state);
    ``one_step``: its three sinks in one step (:data:`ONE_STEP`), one Spark application per checkpoint."""
    source = (REPO / "dags" / "example_clickstream.py").read_text()
    edits = [
        ('dag_id="example_clickstream"', f'dag_id="{JOB}"'),
        ("retained_checkpoints=3,", "retained_checkpoints=3, inline_state_threshold=0,"),
    ]
    if one_step:
        edits += [(f'mode="{mode}"', f'mode="{mode}", step="{ONE_STEP}"') for mode in ("upsert", "append")]
    for old, new in edits:
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
