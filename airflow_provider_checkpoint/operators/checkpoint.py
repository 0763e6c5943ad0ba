"""The three operators of a checkpoint: trigger → Spark step(s) → finalize."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from airflow.sdk import Asset, BaseOperator, Context, DagRunState, TaskInstanceState
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException
from airflow.utils.types import DagRunType

from airflow_provider_checkpoint.core.model import Ack, CheckpointPlan, CheckpointType, JsonDict
from airflow_provider_checkpoint.core.status import AbortReason, JobStatus
from airflow_provider_checkpoint.dataflow.version import VersionCheck, pipeline_version
from airflow_provider_checkpoint.exceptions import (
    CheckpointAborted,
    CheckpointError,
    DocumentError,
    JobNotRunning,
    UnsafePathError,
)
from airflow_provider_checkpoint.jobs.check import check_job
from airflow_provider_checkpoint.jobs.definition import CheckpointJob
from airflow_provider_checkpoint.jobs.registry import register
from airflow_provider_checkpoint.state.handles import ChannelSnapshot
from airflow_provider_checkpoint.storage.config import allowed_roots, default_savepoint_roots
from airflow_provider_checkpoint.storage.paths import resolve_under_roots

SKIPPED_KEY = "skipped"
DECLINE_KEY = "decline"


def _run_is_active(ti: Any, holder: JsonDict) -> bool:
    """Whether the DAG run holding a job's lease is still queued or running."""
    if "dag_id" not in holder:
        return True
    try:
        state = ti.get_dagrun_state(holder["dag_id"], holder["run_id"])
    except Exception:  # cannot tell: keep the lease until it expires
        return True
    return state not in (DagRunState.SUCCESS, DagRunState.FAILED)


def _plan(raw: Any, trigger_task_id: str) -> CheckpointPlan:
    """The plan the trigger pushed; a malformed one fails the task without retry."""
    try:
        return CheckpointPlan.from_dict(raw, f"plan pushed by {trigger_task_id}")
    except DocumentError as e:
        raise AirflowFailException(f"refusing the checkpoint plan: {e}") from e


def _was_skipped(ti: Any, task_id: str) -> bool:
    """Whether ``task_id`` of this DAG run ended skipped (an upstream sensor skipped it)."""
    return bool(
        ti.get_ti_count(dag_id=ti.dag_id, task_ids=[task_id], run_ids=[ti.run_id], states=[TaskInstanceState.SKIPPED])
    )


def sink_assets(job: CheckpointJob) -> list[Asset]:
    """The Asset of every sink that names one: outlets of the task that commits the sinks."""
    return [Asset(uri) for s in job.graph.sinks if (uri := s.asset_uri())]


def trigger_checkpoint(task: BaseOperator, job: CheckpointJob, context: Context) -> CheckpointPlan:
    """Cut the barrier of ``job`` for this DAG run (see :class:`CheckpointTriggerOperator`); returns the plan."""
    options = savepoint_options(job, run_conf(context))
    checkpoint_type = CheckpointType.SAVEPOINT if options else CheckpointType.CHECKPOINT
    ti = context["ti"]
    dag_run = context["dag_run"]
    _register(task, job)
    check = VersionCheck(pipeline_version(job.graph), lambda: check_job(job)) if job.check_versions else None
    try:
        plan = job.coordinator().trigger(
            context["run_id"],
            checkpoint_type,
            options=options,
            periodic=getattr(dag_run, "run_type", None) == DagRunType.SCHEDULED,
            holder_alive=lambda holder: _run_is_active(ti, holder),
            check=check,
        )
    except JobNotRunning as e:
        if e.status is JobStatus.STOPPED:
            _skip(task, ti, str(e))
        raise AirflowFailException(str(e)) from e
    except CheckpointAborted as e:
        if e.reason is AbortReason.MIN_PAUSE:
            _skip(task, ti, e.message)
        raise AirflowFailException(str(e)) from e
    except CheckpointError as e:  # refused input or unreadable storage: a retry cannot help
        raise AirflowFailException(str(e)) from e
    task.log.info(
        "checkpoint %d of job %s: barrier cut, restoring from %s",
        plan.checkpoint_id,
        plan.job_id,
        plan.restore_point.location_url if plan.restore_point else "nothing (first checkpoint)",
    )
    return plan


def _register(task: BaseOperator, job: CheckpointJob) -> None:
    """Record where the job lives, so the restore DAG, the CLI and the UI find it."""
    try:
        register(job)
    except OSError as e:
        task.log.warning(
            "could not record job %s in the job registry under [checkpoint] storage_root (%s); the restore "
            "DAG, the CLI and the Checkpoints page will not find it unless it lives under that root",
            job.job_id,
            e,
        )


def _skip(task: BaseOperator, ti: Any, reason: str) -> None:
    task.log.info("skipping this run: %s", reason)
    ti.xcom_push(key=SKIPPED_KEY, value=reason)
    raise AirflowSkipException(reason)


def run_conf(context: Context) -> Mapping[str, Any]:
    """The savepoint fields of this run's own conf (the trigger form, the REST API, ``dag.test(run_conf=...)``).

    Never the DAG's resolved ``params``: ``dag.test()`` resolves a run's conf into the DAG's shared
    ``Param`` objects, so a later run in the same process would inherit another run's savepoint request.
    """
    conf = getattr(context.get("dag_run"), "conf", None)
    if not isinstance(conf, Mapping):
        return {}
    return {k: conf[k] for k in ("savepoint", "savepoint_dir", "stop_after_savepoint") if k in conf}


def savepoint_options(job: CheckpointJob, params: Mapping[str, Any]) -> JsonDict:
    """Validate the run's savepoint request (:func:`run_conf`) before anything is written."""
    if not params.get("savepoint"):
        if params.get("stop_after_savepoint") or params.get("savepoint_dir"):
            raise AirflowFailException("savepoint_dir and stop_after_savepoint need savepoint=true")
        return {}
    requested = params.get("savepoint_dir") or default_savepoint_roots()[0]
    try:
        directory = resolve_under_roots(str(requested), allowed_roots(job.storage_root))
    except UnsafePathError as e:
        raise AirflowFailException(f"savepoint_dir refused: {e}") from e
    name = f"savepoint-{job.job_id[:6]}-{uuid.uuid4().hex[:12]}"
    return {
        "savepoint_target": f"{directory}/{name}",
        "stop_after_savepoint": bool(params.get("stop_after_savepoint")),
    }


def commit_checkpoint(
    job: CheckpointJob,
    context: Context,
    outlets: Sequence[Any],
    plan: CheckpointPlan,
    acks: Sequence[Ack | None],
    declines: Mapping[str, JsonDict],
) -> JsonDict:
    """Finalize ``plan`` (complete and commit, or abort and raise); emit the sinks' Asset events.

    Raises :class:`CheckpointError` unchanged: the caller decides whether a retry can help.
    """
    completed = job.coordinator().finalize(plan, acks, declines=declines)
    described = {
        Asset(uri).uri: s.describe_commit(plan.checkpoint_id) for s in job.graph.sinks if (uri := s.asset_uri())
    }
    for asset in outlets:
        if isinstance(asset, Asset):
            extra: JsonDict = {"job_id": plan.job_id, "checkpoint_id": plan.checkpoint_id}
            context["outlet_events"][asset].extra = {**extra, **described.get(asset.uri, {})}
    return {"checkpoint_id": completed.checkpoint_id, **completed.stats}


class CheckpointTriggerOperator(BaseOperator):
    """Cuts the barrier: recovers and cleans the job's storage, allocates the id, pushes the plan.

    Skips the run (and so finalize) when the job is STOPPED or a scheduled run falls in
    the minimum pause; fails without retry when the job is FAILED, another checkpoint of
    the job is in flight, a restore request is invalid, or a new version of the pipeline
    fails the pipeline check (run once per version before its first checkpoint, in a Spark
    session of its own: :mod:`~airflow_provider_checkpoint.jobs.check`). Returns (XCom) the checkpoint
    plan every step and the finalize task read.

    The run's params ``savepoint``, ``savepoint_dir`` and ``stop_after_savepoint`` (the
    trigger form) make the checkpoint a savepoint; ``savepoint_dir`` must lie under an
    allowed root (``[checkpoint] savepoint_roots`` or the job's storage root).

    :param job: The checkpointed job (built by ``CheckpointedPipeline`` at DAG-parse time).
    """

    ui_color = "#ffe7ba"

    def __init__(self, *, job: CheckpointJob, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.job = job

    def execute(self, context: Context) -> JsonDict:
        return trigger_checkpoint(self, self.job, context).to_dict()


class SparkCheckpointOperator(BaseOperator):
    """One step: a Spark job that processes its input up to the barrier and acks.

    Writes state snapshots and staged sink output under its own attempt directory, so
    an Airflow retry never mixes files with an earlier attempt. Malformed input fails
    without retry; everything else is retried by Airflow. Returns (XCom) the step's ack;
    a failed attempt pushes its decline under the ``decline`` key.

    :param job: The checkpointed job (built by ``CheckpointedPipeline`` at DAG-parse time).
    :param step: Name of the step of the job's graph this task runs.
    :param trigger_task_id: Task id of the :class:`CheckpointTriggerOperator` whose plan it follows.
    """

    ui_color = "#d6f5e3"

    def __init__(self, *, job: CheckpointJob, step: str, trigger_task_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.job = job
        self.step = step
        self.trigger_task_id = trigger_task_id

    def execute(self, context: Context) -> JsonDict:
        ti = context["ti"]
        plan = _plan(ti.xcom_pull(task_ids=self.trigger_task_id), self.trigger_task_id)
        return self._step(ti, plan).to_dict()

    def _step(self, ti: Any, plan: CheckpointPlan) -> Ack:
        """Run this step of ``plan`` as attempt ``try_number``; on failure push the decline and raise."""
        from airflow_provider_checkpoint.spark.acks import decline_for, decline_record
        from airflow_provider_checkpoint.spark.runner import describe_metrics

        if plan.restore_point is not None:
            try:
                for url in filter(None, (plan.restore_point.location_url, plan.restore_point.base_url)):
                    resolve_under_roots(url, allowed_roots(self.job.storage_root))
            except UnsafePathError as e:
                raise AirflowFailException(f"the plan's restore point is refused: {e}") from e
        attempt = int(ti.try_number)
        channels = self._upstream_channels(ti, plan)
        try:
            ack = self._run(plan, attempt, channels)
        except Exception as e:
            declined = decline_for(e)
            ti.xcom_push(key=DECLINE_KEY, value=decline_record(self.step, declined))
            if declined.fatal:
                raise AirflowFailException(str(declined)) from e
            raise
        self.log.info(
            "step %s acked checkpoint %d (attempt %d): %s",
            self.step,
            plan.checkpoint_id,
            attempt,
            describe_metrics(ack.metrics),
        )
        return ack

    def _upstream_channels(self, ti: Any, plan: CheckpointPlan) -> dict[str, tuple[str, ChannelSnapshot]]:
        """The channels of this checkpoint from the upstream steps' acks (their latest attempts)."""
        channels: dict[str, tuple[str, ChannelSnapshot]] = {}
        for upstream in self.job.graph.upstream_steps(self.step):
            raw = ti.xcom_pull(task_ids=upstream)
            try:
                ack = Ack.from_dict(raw, f"ack of task {upstream}") if raw else None
            except DocumentError as e:
                raise AirflowFailException(f"refusing the channels of {upstream}: {e}") from e
            if ack is None or ack.job_id != plan.job_id or ack.checkpoint_id != plan.checkpoint_id:
                raise AirflowFailException(f"step {upstream} has not acked checkpoint {plan.checkpoint_id}")
            channels.update((uid, (ack.attempt_dir, channel)) for uid, channel in ack.channels.items())
        return channels

    def _run(self, plan: CheckpointPlan, attempt: int, channels: dict[str, tuple[str, ChannelSnapshot]]) -> Ack:
        from airflow_provider_checkpoint.spark.execution import ExecutionMode, resolve_execution
        from airflow_provider_checkpoint.spark.runner import run_step
        from airflow_provider_checkpoint.spark.session import step_session
        from airflow_provider_checkpoint.spark.step_reads import spark_on_first_use, step_input_bytes, step_reads
        from airflow_provider_checkpoint.spark.submitted import SubmittedStep

        execution = resolve_execution(self.job.spark_conn_id)
        self.log.info("step %s of checkpoint %d runs in %s", self.step, plan.checkpoint_id, execution.describe())
        if execution.mode is ExecutionMode.SUBMIT:  # spark-submit's driver is a JVM whatever the step needs
            assert execution.conn_id is not None and self.dag is not None
            self._submitted = SubmittedStep(
                self.job, execution.conn_id, self.dag.fileloc, self.dag.dag_id, self.task_id
            )
            return self._submitted.run(self.job.storage(), self.step, plan, attempt, channels)
        input_bytes = None if execution.remote else step_input_bytes(self.job.graph, self.step, plan)
        # The storage opens while the JVM starts (an object store's client library and first contact
        # cost a fresh task process about as much as its requests); pyspark is imported first so the
        # two threads import disjoint modules. A step that may read and merge on the driver in this checkpoint
        # starts the session only if it needs it (:class:`~airflow_provider_checkpoint.spark.session.SparkHandle`).
        import pyspark.sql  # noqa: F401

        reads = step_reads(self.job.graph, self.step)  # one walk of the graph: here and in run_step
        may_skip = spark_on_first_use(self.job.graph, self.step, plan, reads)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="open-storage") as pool:
            opening = pool.submit(self.job.storage)
            spark = step_session(self.job.spark_conf, execution.remote, input_bytes, may_skip)
            storage = opening.result()
        if not spark.started:
            self.log.info("step %s starts Spark only if it needs it: its input may be read on the driver", self.step)
        settings = self.job.resolved_settings()
        return run_step(spark, storage, self.job.graph, self.step, plan, attempt, channels, settings, reads)

    def on_kill(self) -> None:
        """Kill the spark-submit driver of this attempt (``submit`` mode) through the Spark provider's hook."""
        submitted = getattr(self, "_submitted", None)
        if submitted is not None:
            submitted.kill()


class CheckpointFinalizeOperator(BaseOperator):
    """Judges the pending checkpoint; on success commits ``_metadata``, then the sinks.

    Runs whatever the steps did (``trigger_rule=all_done``). On completion it emits an
    Asset event for every sink; otherwise it aborts the checkpoint (discarding its files
    and staged output) and fails the run without retry. Skips when the trigger skipped.
    Returns (XCom) ``{"checkpoint_id": n, ...}`` with the checkpoint's statistics.

    :param job: The checkpointed job (built by ``CheckpointedPipeline`` at DAG-parse time).
    :param trigger_task_id: Task id of the :class:`CheckpointTriggerOperator` whose plan it judges.
    :param step_task_ids: Task ids of the :class:`SparkCheckpointOperator` steps whose acks it collects.
    """

    ui_color = "#cfe2ff"

    def __init__(
        self, *, job: CheckpointJob, trigger_task_id: str, step_task_ids: Sequence[str], **kwargs: Any
    ) -> None:
        kwargs.setdefault("trigger_rule", "all_done")
        kwargs.setdefault("outlets", sink_assets(job))
        super().__init__(**kwargs)
        self.job = job
        self.trigger_task_id = trigger_task_id
        self.step_task_ids = list(step_task_ids)

    def execute(self, context: Context) -> JsonDict:
        ti = context["ti"]
        raw_plan = ti.xcom_pull(task_ids=self.trigger_task_id)
        if raw_plan is None:
            skipped = ti.xcom_pull(task_ids=self.trigger_task_id, key=SKIPPED_KEY)
            if skipped:
                raise AirflowSkipException(f"no checkpoint in this run: {skipped}")
            if _was_skipped(ti, self.trigger_task_id):  # e.g. the input sensor found no new input
                raise AirflowSkipException(f"no checkpoint in this run: {self.trigger_task_id} was skipped")
            raise AirflowFailException(f"{self.trigger_task_id} failed: no checkpoint was triggered in this run")
        plan = _plan(raw_plan, self.trigger_task_id)
        declines = {t: d for t in self.step_task_ids if (d := ti.xcom_pull(task_ids=t, key=DECLINE_KEY))}
        acks: list[Ack | None] = []
        for task_id in self.step_task_ids:
            raw = ti.xcom_pull(task_ids=task_id)
            try:
                acks.append(Ack.from_dict(raw, f"ack of task {task_id}") if raw else None)
            except DocumentError as e:
                self.log.error("refusing the ack of %s: %s", task_id, e)
                declines[task_id] = {"reason": AbortReason.CORRUPT_STATE.value, "message": str(e)}
                acks.append(None)
        try:
            return commit_checkpoint(self.job, context, self.outlets, plan, acks, declines)
        except CheckpointError as e:  # aborted, or a refused document: a retry cannot help
            raise AirflowFailException(str(e)) from e
