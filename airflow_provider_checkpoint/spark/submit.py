"""The driver of a step submitted with spark-submit (``submit`` execution mode).

``SparkSubmitHook`` runs this file (client deploy mode) with::

    --dag-file F --dag-id D --task-id T --storage-root URL --plan-file P --attempt N

It loads the pipeline from the DAG file, runs the step in the session spark-submit
configured, and writes the ack to ``<attempt_dir>/_ack.json`` in checkpoint storage (or,
when the step declines, ``_decline.json``) for the Airflow task to read back and verify.
Also runnable as ``python -m airflow_provider_checkpoint.spark.submit``.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # run as a file: this package directory must not shadow top-level modules

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
from typing import TYPE_CHECKING, Protocol, runtime_checkable  # noqa: E402

if TYPE_CHECKING:
    from airflow.sdk import DAG

    from airflow_provider_checkpoint.spark.submitted import StepJob

log = logging.getLogger("airflow_provider_checkpoint.spark.submit")


@runtime_checkable
class StepTask(Protocol):
    """A task that runs a step of a checkpointed pipeline (``SparkCheckpointOperator``): its job and step."""

    job: StepJob
    step: str


def load_dag(dag_file: str, dag_id: str) -> DAG:
    """DAG ``dag_id`` as ``dag_file`` defines it now (the file is executed, as Airflow parses it)."""
    from airflow.sdk import DAG

    spec = importlib.util.spec_from_file_location(f"checkpoint_dag_{abs(hash(dag_file))}", dag_file)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"cannot load DAG file {dag_file}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for value in vars(module).values():
        if isinstance(value, DAG) and value.dag_id == dag_id:
            return value
    raise LookupError(f"DAG {dag_id} not found in {dag_file}")


def load_step(dag_file: str, dag_id: str, task_id: str) -> tuple[StepJob, str]:
    """The job and step of task ``task_id`` of DAG ``dag_id`` defined in ``dag_file``."""
    task = load_dag(dag_file, dag_id).get_task(task_id)
    if not isinstance(task, StepTask):  # SparkCheckpointOperator, chained ones too
        raise TypeError(f"{dag_id}.{task_id} is a {type(task).__name__}, not a step of a checkpointed pipeline")
    return task.job, task.step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="airflow_provider_checkpoint.spark.submit")
    for name in ("--dag-file", "--dag-id", "--task-id", "--storage-root", "--plan-file"):
        parser.add_argument(name, required=True)
    parser.add_argument("--attempt", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # no line per py4j connection in the task log

    from pyspark.sql import SparkSession

    from airflow_provider_checkpoint.core.documents import Fields, relative_path
    from airflow_provider_checkpoint.core.model import CheckpointPlan
    from airflow_provider_checkpoint.spark.acks import ACK_FILE, decline_for, write_decline
    from airflow_provider_checkpoint.spark.runner import run_step
    from airflow_provider_checkpoint.spark.submitted import CHANNELS_KEY
    from airflow_provider_checkpoint.state.handles import ChannelSnapshot
    from airflow_provider_checkpoint.storage.config import job_storage

    with open(args.plan_file) as f:
        document = json.load(f)
    channels = {}
    for uid, value in Fields(document, args.plan_file).obj(CHANNELS_KEY, default={}).raw.items():
        entry = Fields(value, args.plan_file, f"{CHANNELS_KEY}.{uid}")
        attempt_dir = relative_path(entry.raw.get("attempt_dir"), args.plan_file, entry.name("attempt_dir"))
        where = f"{CHANNELS_KEY}.{uid}"
        channel = ChannelSnapshot.from_dict(entry.raw.get("channel"), args.plan_file, where, attempt_dir, uid)
        channels[uid] = (attempt_dir, channel)
    plan = CheckpointPlan.from_dict({k: v for k, v in document.items() if k != CHANNELS_KEY}, args.plan_file)
    job, step = load_step(args.dag_file, args.dag_id, args.task_id)
    storage = job_storage(job.job_id, args.storage_root, job.storage_conn_id)
    attempt_dir = storage.attempt_dir(plan.checkpoint_id, step, args.attempt)
    spark = SparkSession.builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    try:
        ack = run_step(spark, storage, job.graph, step, plan, args.attempt, channels, job.resolved_settings())
    except Exception as e:
        write_decline(storage, attempt_dir, decline_for(e))
        raise
    storage.write_atomic(f"{attempt_dir}/{ACK_FILE}", json.dumps(ack.to_dict()).encode())
    log.info("step %s of checkpoint %d (attempt %d) acked", step, plan.checkpoint_id, args.attempt)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
