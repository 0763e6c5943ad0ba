"""Steps on a Spark Connect server take the driver's paths as embedded steps do.

Over Spark Connect the client has no JVM side to read a plan's statistics from, so until this test the size
estimate (:func:`~airflow_provider_checkpoint.dataflow.driver_rows.estimated_bytes`) was unknown there and
every checkpoint of a small keyed state took the Spark path (state read, diffed and written by Spark jobs):
2–3× slower on a warm server (docs/benchmarks.md, "Step tasks on a warm Spark Connect server"). The server's
cost explain gives it now. Checked here on a real server with the provider's
:func:`~airflow_provider_checkpoint.spark.session.connect_server_conf`: the estimate of the landed files
against their bytes, its rows (:func:`~airflow_provider_checkpoint.state.spark_backend.estimated_rows`, so the
first state too is merged on the driver); every checkpoint merged on the driver; the table against pandas over
the landed events. Then the same job with no input small enough for the driver: its states written by Spark jobs,
the first by range (the server's task slots asked of its plan), the table against pandas. A server takes ~10 s
to start: ``make test-full`` only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest

from airflow_provider_checkpoint.spark.session import connect_server_conf
from tests.live.spark_connect import spark_connect_server

pytestmark = [pytest.mark.spark, pytest.mark.full]
REPO = Path(__file__).resolve().parents[2]


def _checkpoints(url: str, base: Path, *mode: str) -> list[dict[str, Any]]:
    """Three checkpoints of ``connect_steps`` under ``base`` (``mode``: its ``spark``): their JSON lines."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    done = subprocess.run(
        [sys.executable, "-m", "tests.spark.connect_steps", url, str(base), "3", *mode],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [line["checkpoint"] for line in lines] == [1, 2, 3]
    return lines


def _assert_table_is_pandas(base: Path) -> None:
    landed = pd.concat(pd.read_json(p, lines=True) for p in sorted((base / "landing").glob("*.json")))
    truth = (
        landed.groupby("user")
        .agg(events=("ts", "size"), first_seen=("ts", "min"), last_seen=("ts", "max"))
        .reset_index()
        .sort_values("user", ignore_index=True)
    )
    table = pq.read_table(base / "table").to_pandas()
    got = table[["user", "events", "first_seen", "last_seen"]].sort_values("user", ignore_index=True)
    pd.testing.assert_frame_equal(got, truth, check_dtype=False)


def test_steps_over_spark_connect_merge_on_the_driver(tmp_path: Path) -> None:
    with spark_connect_server(tmp_path / "spark-connect.log", conf=connect_server_conf()) as url:
        lines = _checkpoints(url, tmp_path / "job")
        spark_lines = _checkpoints(url, tmp_path / "spark-job", "spark")
    for line in lines:  # Spark prints the size to one decimal of its unit (KiB here): rounded up
        assert line["file_bytes"] <= line["estimated_bytes"] <= line["file_bytes"] + 0.1 * 1024, line
        # rows as Spark estimates them: bytes over 8 + the row's default size (STRING 20, STRING 20, LONG 8)
        assert line["estimated_rows"] == line["estimated_bytes"] // (8 + 48), line
        assert line["task_slots"] == 2, line  # the server runs local[2]
        (step,) = line["steps"].values()
        assert step["state_merged_on_driver"], step  # the first state too: its rows are estimated
        if line["checkpoint"] > 1:
            assert step["state_incremental"], step
    _assert_table_is_pandas(tmp_path / "job")
    for line in spark_lines:  # the first state by range in Spark jobs (it asks the server for its task slots)
        (step,) = line["steps"].values()
        assert not step["state_merged_on_driver"], step
    _assert_table_is_pandas(tmp_path / "spark-job")
