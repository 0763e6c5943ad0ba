"""Where a step's Spark job runs, chosen by the Spark provider's connections.

* ``local``: no connection — an embedded ``local[*]`` session inside the step task.
* ``connect``: a ``spark_connect`` connection — a session from ``SparkConnectHook``'s URL.
* ``submit``: a ``spark`` connection (``spark://…``, ``yarn``, ``k8s://…``, ``local[n]``) —
  ``SparkSubmitHook`` runs the package's driver (:mod:`airflow_provider_checkpoint.spark.submit`)
  in client deploy mode; the driver writes the ack into the step's attempt directory and
  the task reads it back and verifies it.

The connection id comes from the pipeline (``spark_conn_id=``), else ``[checkpoint]
spark_conn_id``.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.core.documents import load_json
from airflow_provider_checkpoint.core.failures import AbortReason
from airflow_provider_checkpoint.core.model import Ack, CheckpointPlan, JsonDict
from airflow_provider_checkpoint.core.state_handles import ChannelSnapshot
from airflow_provider_checkpoint.exceptions import (
    CheckpointStorageError,
    PipelineDefinitionError,
    RefusedInputError,
    StepDeclined,
)
from airflow_provider_checkpoint.storage import JobStorage

if TYPE_CHECKING:
    from airflow_provider_checkpoint.jobs.definition import CheckpointJob

log = logging.getLogger(__name__)
DRIVER = Path(__file__).with_name("submit.py")
ACK_FILE = "_ack.json"
CHANNELS_KEY = "_channels"
"""In the plan file handed to the driver: the upstream channels the step reads."""
DECLINE_FILE = "_decline.json"
# the defaults of the embedded session that make sense on any cluster (no loopback binding)
SUBMIT_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.sources.partitionOverwriteMode": "static",
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
}


class ExecutionMode(enum.StrEnum):
    LOCAL = "local"
    CONNECT = "connect"
    SUBMIT = "submit"


@dataclass(frozen=True)
class Execution:
    mode: ExecutionMode
    conn_id: str | None = None
    remote: str | None = None

    def describe(self) -> str:
        if self.mode is ExecutionMode.LOCAL:
            return "an embedded local[*] session"
        how = "spark-submit" if self.mode is ExecutionMode.SUBMIT else "Spark Connect"
        return f"{how} through connection {self.conn_id!r}"


def decline_for(e: BaseException) -> StepDeclined:
    """How an exception of a step declines its checkpoint."""
    if isinstance(e, StepDeclined):
        return e
    reason = AbortReason.CORRUPT_STATE if isinstance(e, CheckpointStorageError) else AbortReason.DECLINED
    reason = AbortReason.IO_ERROR if isinstance(e, OSError) else reason
    fatal = isinstance(e, RefusedInputError | CheckpointStorageError)  # StateTooLargeError is refused input
    return StepDeclined(reason, str(e), fatal)


def resolve_execution(spark_conn_id: str | None) -> Execution:
    """The execution of a job's steps from its options and the ``[checkpoint]`` section."""
    from airflow_provider_checkpoint.storage.config import config_value

    conn_id = spark_conn_id or config_value("spark_conn_id") or None
    if conn_id:
        from airflow.sdk import BaseHook

        conn_type = BaseHook.get_connection(conn_id).conn_type
        if conn_type == "spark":
            return Execution(ExecutionMode.SUBMIT, conn_id)
        if conn_type == "spark_connect":
            from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

            return Execution(ExecutionMode.CONNECT, conn_id, SparkConnectHook(conn_id).get_connection_url())
        raise PipelineDefinitionError(
            f"connection {conn_id!r} has type {conn_type!r}: steps run through a 'spark' connection "
            "(spark-submit) or a 'spark_connect' connection (Spark Connect)"
        )
    return Execution(ExecutionMode.LOCAL)


def submit_conf(spark_conf: dict[str, str]) -> dict[str, str]:
    """spark-submit ``--conf`` of a step: defaults, the executors' Python, the pipeline's own."""
    conf = {**SUBMIT_CONF, **spark_conf}
    conf.setdefault("spark.pyspark.python", os.environ.get("PYSPARK_PYTHON") or sys.executable)
    conf.setdefault("spark.pyspark.driver.python", sys.executable)  # client mode: the driver runs here
    return conf


def read_ack(storage: JobStorage, plan: CheckpointPlan, step: str, attempt: int) -> Ack:
    """The ack the driver wrote, verified against this attempt; its state files checked.

    Raises :class:`StepDeclined` when the ack is missing, belongs to another job,
    checkpoint, step or attempt, or names a file outside the attempt directory, and
    :class:`CheckpointStorageError` when a state file is missing or altered.
    """
    attempt_dir = storage.attempt_dir(plan.checkpoint_id, step, attempt)
    where = storage.url(f"{attempt_dir}/{ACK_FILE}")
    if not storage.exists(f"{attempt_dir}/{ACK_FILE}"):
        raise StepDeclined(AbortReason.DECLINED, f"the driver finished without writing its ack {where}", False)
    try:
        ack = Ack.from_dict(load_json(storage.read_bytes(f"{attempt_dir}/{ACK_FILE}"), where), where)
    except (ValueError, KeyError, TypeError) as e:
        raise StepDeclined(AbortReason.DECLINED, f"unreadable ack {where}: {e}", False) from e
    got = (ack.job_id, ack.checkpoint_id, ack.step, ack.attempt, ack.attempt_dir)
    want = (plan.job_id, plan.checkpoint_id, step, attempt, attempt_dir)
    if got != want:
        raise StepDeclined(AbortReason.DECLINED, f"ack {where} is for {got}, expected {want}", False)
    restored = plan.restore_point.operators if plan.restore_point else {}
    for uid, snapshot in ack.operators.items():
        kept = set(restored[uid].handles) if uid in restored else set()
        for handle in snapshot.handles:
            own = handle.path.startswith(f"{attempt_dir}/")
            if not own and handle not in kept:
                raise StepDeclined(
                    AbortReason.DECLINED,
                    f"ack {where} names {handle.path}, neither in {attempt_dir} nor kept from its restore point",
                    False,
                )
            storage.verify(handle, deep=own)
    storage.delete(f"{attempt_dir}/{ACK_FILE}")
    return ack


def read_decline(storage: JobStorage, attempt_dir: str) -> StepDeclined | None:
    """The decline the driver recorded before failing, if any."""
    if not storage.exists(f"{attempt_dir}/{DECLINE_FILE}"):
        return None
    try:
        d = load_json(storage.read_bytes(f"{attempt_dir}/{DECLINE_FILE}"), storage.url(f"{attempt_dir}/{DECLINE_FILE}"))
        reasons = {r.value: r for r in AbortReason}
        return StepDeclined(reasons.get(str(d["reason"]), AbortReason.DECLINED), str(d["message"]), bool(d["fatal"]))
    except (ValueError, KeyError, TypeError) as e:
        return StepDeclined(AbortReason.DECLINED, f"unreadable {DECLINE_FILE} in {attempt_dir}: {e}", False)


def write_decline(storage: JobStorage, attempt_dir: str, declined: StepDeclined) -> None:
    record: JsonDict = {"reason": declined.reason.value, "message": str(declined), "fatal": declined.fatal}
    storage.write_atomic(f"{attempt_dir}/{DECLINE_FILE}", json.dumps(record).encode())


SUBMITTED_STEP_ENV = "CHECKPOINT_SUBMITTED_STEP"
"""Tags every local process of a submitted step attempt, so killing the task finds them all."""
KILL_SECONDS = 30.0


def _running(process: Any) -> bool:
    import psutil

    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


class SubmittedStep:
    """One attempt of one step, run by ``SparkSubmitHook`` in client deploy mode.

    ``kill()`` (the task's ``on_kill``) kills the driver through the hook. Every attempt
    has its own attempt directory and the ack names its attempt, so a retry never mixes
    with an earlier attempt's files, even one whose driver is still being torn down.
    """

    def __init__(self, job: CheckpointJob, conn_id: str, dag_file: str, dag_id: str, task_id: str) -> None:
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
        """The hook's ``on_kill`` (kills spark-submit, i.e. the driver JVM, and cluster-side
        work), then every local process this attempt started that outlived it: the Python
        driver and its workers, found by the tag in their environment (reparented ones
        too), until none is left or :data:`KILL_SECONDS` pass."""
        if self.hook is None:
            return
        import psutil

        process = getattr(self.hook, "_submit_sp", None)
        try:
            started = psutil.Process(process.pid).children(recursive=True) if process is not None else []
        except psutil.Error:
            started = []
        self.hook.on_kill()
        deadline = time.monotonic() + KILL_SECONDS
        while True:
            alive = [p for p in {*started, *self._tagged()} if _running(p)]
            if not alive or time.monotonic() > deadline:
                break
            for p in alive:
                with contextlib.suppress(psutil.Error):
                    p.kill()
            psutil.wait_procs(alive, timeout=2)
        if alive:
            log.warning("processes of the killed step still alive: %s", sorted(p.pid for p in alive))

    def _tagged(self) -> list[Any]:
        import psutil

        found = []
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if p.environ().get(SUBMITTED_STEP_ENV) == self.tag:
                    found.append(p)
        return found
