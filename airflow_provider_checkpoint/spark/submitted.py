"""One step attempt run by ``SparkSubmitHook`` in client deploy mode.

The driver (:mod:`airflow_provider_checkpoint.spark.submit`) runs the step and writes its
ack into the attempt directory; the task reads the ack back (:mod:`.acks`).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from airflow_provider_checkpoint.core.model import Ack, CheckpointPlan
from airflow_provider_checkpoint.spark.acks import read_ack, read_decline
from airflow_provider_checkpoint.spark.processes import SUBMITTED_STEP_ENV, kill_step_processes
from airflow_provider_checkpoint.spark.session import DEFAULT_CONF, LOG4J2_PROPERTIES
from airflow_provider_checkpoint.state.handles import ChannelSnapshot
from airflow_provider_checkpoint.storage import JobStorage

if TYPE_CHECKING:
    from airflow_provider_checkpoint.core.settings import CheckpointSettings
    from airflow_provider_checkpoint.dataflow.planner import PipelineGraph


class StepJob(Protocol):
    """What a step needs of its job (:class:`~airflow_provider_checkpoint.jobs.definition.CheckpointJob`)."""

    @property
    def job_id(self) -> str: ...

    @property
    def graph(self) -> PipelineGraph: ...

    @property
    def storage_root(self) -> str | None: ...

    @property
    def storage_conn_id(self) -> str | None: ...

    @property
    def spark_conf(self) -> dict[str, str]: ...

    def resolved_settings(self) -> CheckpointSettings: ...


DRIVER = Path(__file__).with_name("submit.py")
CHANNELS_KEY = "_channels"
"""In the plan file handed to the driver: the upstream channels the step reads."""
_EMBEDDED_ONLY = (
    "spark.driver.",
    "spark.ui.showConsoleProgress",
    "spark.hadoop.parquet.",
    "spark.sql.inMemory",
    "spark.python.daemon.",  # a cluster's executors may lack this package until the step ships it
)
SUBMIT_CONF = {key: value for key, value in DEFAULT_CONF.items() if not key.startswith(_EMBEDDED_ONLY)}
"""The defaults of the embedded session that make sense on any cluster (no loopback binding)."""


def submit_conf(spark_conf: dict[str, str]) -> dict[str, str]:
    """spark-submit ``--conf`` of a step: defaults, the executors' Python, the pipeline's own."""
    conf = {**SUBMIT_CONF, **spark_conf}
    conf.setdefault("spark.pyspark.python", os.environ.get("PYSPARK_PYTHON") or sys.executable)
    conf.setdefault("spark.pyspark.driver.python", sys.executable)  # client mode: the driver runs here
    # the driver's log4j output is the task log: warnings and errors only, as in the embedded session
    conf.setdefault("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={LOG4J2_PROPERTIES.as_uri()}")
    return conf


class SubmittedStep:
    """One attempt of one step, run by ``SparkSubmitHook`` in client deploy mode.

    ``kill()`` (the task's ``on_kill``) kills the driver through the hook. Every attempt
    has its own attempt directory and the ack names its attempt, so a retry never mixes
    with an earlier attempt's files, even one whose driver is still being torn down.
    """

    def __init__(self, job: StepJob, conn_id: str, dag_file: str, dag_id: str, task_id: str) -> None:
        self.tag = uuid.uuid4().hex
        self.job = job
        self.conn_id = conn_id
        self.dag_file = dag_file
        self.dag_id = dag_id
        self.task_id = task_id
        self.hook: Any = None

    def run(
        self,
        storage: JobStorage,
        step: str,
        plan: CheckpointPlan,
        attempt: int,
        channels: Mapping[str, tuple[str, ChannelSnapshot]] | None = None,
    ) -> Ack:
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        from airflow_provider_checkpoint.storage.config import default_storage_root

        attempt_dir = storage.attempt_dir(plan.checkpoint_id, step, attempt)
        storage.delete(attempt_dir)  # whatever an earlier driver of this attempt number left
        with tempfile.NamedTemporaryFile("w", prefix="checkpoint-plan-", suffix=".json", delete=False) as f:
            inputs = {uid: {"attempt_dir": d, "channel": c.to_dict()} for uid, (d, c) in (channels or {}).items()}
            json.dump({**plan.to_dict(), CHANNELS_KEY: inputs}, f)
        args = [
            "--dag-file", self.dag_file, "--dag-id", self.dag_id, "--task-id", self.task_id,
            "--storage-root", self.job.storage_root or default_storage_root(),
            "--plan-file", f.name, "--attempt", str(attempt),
        ]  # fmt: skip
        self.hook = SparkSubmitHook(
            conn_id=self.conn_id,
            conf=submit_conf(self.job.spark_conf),
            name=f"checkpoint-{plan.job_id}-{plan.checkpoint_id}-{step}-attempt-{attempt}",
            application_args=args,
            deploy_mode="client",
            env_vars={SUBMITTED_STEP_ENV: self.tag},
        )
        try:
            self.hook.submit(application=str(DRIVER))
        except Exception as e:
            declined = read_decline(storage, attempt_dir)
            if declined is not None:
                raise declined from e
            raise
        finally:
            os.unlink(f.name)
        return read_ack(storage, plan, step, attempt)

    def kill(self) -> None:
        """The hook's ``on_kill`` and every local process this attempt started (:func:`kill_step_processes`)."""
        if self.hook is not None:
            kill_step_processes(self.hook, self.tag)
