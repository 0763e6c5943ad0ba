"""Builders for step contexts over real local storage, and landing and reading files."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow.dataset as ds
import pytest

from airflow_provider_checkpoint.core.model import Barrier, CheckpointPlan, CheckpointType
from airflow_provider_checkpoint.dataflow.context import StepContext
from airflow_provider_checkpoint.exceptions import SinkSchemaError
from airflow_provider_checkpoint.spark.session import SparkHandle
from airflow_provider_checkpoint.storage import JobStorage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_provider_checkpoint.connectors.base.sink import TableDirectorySink


def step_context(spark: SparkSession, storage: JobStorage, checkpoint_id: int, attempt: int = 1) -> StepContext:
    plan = CheckpointPlan(
        job_id=storage.job_id,
        run_id=f"run-{checkpoint_id}",
        barrier=Barrier(checkpoint_id, time.time(), CheckpointType.CHECKPOINT, {}),
        steps=("step",),
        timeout_seconds=600,
    )
    return StepContext(SparkHandle.of(spark), storage, plan, "step", attempt)


def staged_and_committed(
    spark: SparkSession, sink: TableDirectorySink, storage: JobStorage, checkpoint_id: int, rows: Any, schema: str
) -> None:
    """Checkpoint ``checkpoint_id`` of ``rows`` (a DDL ``schema``) into ``sink``: staged, then committed."""
    ctx = step_context(spark, storage, checkpoint_id)
    sink.prepare(ctx)
    sink.commit(checkpoint_id, sink.stage(ctx, spark.createDataFrame(rows, schema)))


def refused_stage(
    spark: SparkSession,
    sink: TableDirectorySink,
    storage: JobStorage,
    checkpoint_id: int,
    rows: Any,
    schema: str,
    problem: str,
) -> str:
    """The message of the :class:`SinkSchemaError` matching ``problem`` with which ``sink`` (a table of files)
    refuses to stage ``rows`` (a DDL ``schema``) as checkpoint ``checkpoint_id``, having staged no Parquet file."""
    ctx = step_context(spark, storage, checkpoint_id)
    sink.prepare(ctx)
    with pytest.raises(SinkSchemaError, match=problem) as refused:
        sink.stage(ctx, spark.createDataFrame(rows, schema))
    assert not list(Path(sink.path).glob("_staging/**/*.parquet")), "nothing staged"
    return str(refused.value)


def write_json(path: Path, rows: list[dict[str, Any]]) -> None:
    """Land ``rows`` as JSON Lines atomically (hidden name, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_name("." + path.name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    path.with_name("." + path.name).rename(path)


def table(path: Path) -> pd.DataFrame:
    """A Parquet table as any reader sees it."""
    return ds.dataset(str(path), format="parquet").to_table().to_pandas() if path.exists() else pd.DataFrame()


def delta_commits_per_checkpoint(table: Path) -> Counter[int]:
    """How many entries of a Delta table's ``_delta_log`` carry a ``txn`` action, per checkpoint id."""
    counts: Counter[int] = Counter()
    for log in (table / "_delta_log").glob("*.json"):
        for line in log.read_text().splitlines():
            action = json.loads(line)
            if "txn" in action:
                counts[action["txn"]["version"]] += 1
    return counts
