"""A healthy step is quiet: nothing on stderr (Airflow logs a task's stderr at ERROR), no progress bars.

The step runs in a fresh Python process, as in an Airflow task, so the embedded Spark
JVM starts from scratch with the provider's settings; its output is captured whole.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

STEP = """
import logging, sys
logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
from airflow_provider_checkpoint.coordinator import CheckpointCoordinator
from airflow_provider_checkpoint.core.settings import CheckpointSettings
from airflow_provider_checkpoint.dataflow import FileSource, KeyedAggregate, ParquetTableSink, PipelineGraph
from airflow_provider_checkpoint.spark.runner import run_step
from airflow_provider_checkpoint.spark.session import get_spark
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.testing.clickstream import land_events

base = sys.argv[1]
land_events(__import__("pathlib").Path(base, "landing"), "events-1.json", 5000, seed=1)
events = FileSource("events", base + "/landing", "json", "user STRING, page STRING, ts LONG")
views = KeyedAggregate("page_views", events, keys=["page"], aggs={"views": "count"})
sink = ParquetTableSink("views_table", views, base + "/views", "upsert", ["page"])
graph = PipelineGraph([events, views, sink])
storage = JobStorage.for_job(base + "/checkpoints", "job")
coordinator = CheckpointCoordinator(storage, graph, CheckpointSettings())
plan = coordinator.trigger("run-1")
spark = get_spark(master="local[2]")
acks = [run_step(spark, storage, graph, step, plan, 1) for step in plan.steps]
coordinator.finalize(plan, acks)
print("STEP DONE")
"""


def test_a_healthy_step_writes_nothing_to_stderr_and_one_line_per_phase(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    done = subprocess.run(
        [sys.executable, "-c", STEP, str(tmp_path)], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "STEP DONE" in done.stdout
    assert done.stderr == "", f"stderr (ERROR in an Airflow task log):\n{done.stderr}"
    assert not re.search(r"\[Stage \d+", done.stdout), "console progress bar"
    assert " ERROR " not in done.stdout and "log4j profile" not in done.stdout, done.stdout
    assert "INFO py4j" not in done.stdout, "py4j's per-connection lines in the task log"
    phases = [line for line in done.stdout.splitlines() if line.startswith("INFO airflow_provider_checkpoint.spark")]
    assert [line.split(": ")[1] for line in phases] == ["source events", "stateful page_views", "sink views_table"]
    # the JSON lines are read on the driver for the aggregate (connectors/files/json_driver.py): counted there
    assert re.search(r"source events: files_in 1, records_in 5,000 in \d+\.\d\ds", phases[0]), phases[0]
    assert re.search(
        r"stateful page_views: state_rows 10, state_bytes [\d.]+ (B|KiB), (state_files \d+|state_inline 1)", phases[1]
    )
    assert "records_in" not in phases[1], phases[1]  # counted once, where they were read
