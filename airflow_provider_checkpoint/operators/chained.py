"""One Airflow task for a whole checkpoint of a single-step pipeline: trigger, step, finalize.

Flink chains operators into one task to save the hand-overs between them; here chaining
saves the two task hops (scheduler latency) between trigger, step and finalize.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_checkpoint.core.faults import fault_scope
from airflow_provider_checkpoint.core.model import CheckpointPlan, JsonDict
from airflow_provider_checkpoint.exceptions import CheckpointAbortedError, CheckpointError, DocumentError
from airflow_provider_checkpoint.jobs.definition import CheckpointJob
from airflow_provider_checkpoint.operators.checkpoint import (
    DECLINE_KEY,
    SparkCheckpointOperator,
    commit_checkpoint,
    sink_assets,
    trigger_checkpoint,
)
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore

PLAN_KEY = "plan"
ACK_KEY = "ack"


class ChainedCheckpointOperator(SparkCheckpointOperator):
    """Trigger, the one step and finalize of a checkpoint in one task (``chain=True``).

    Each part is the code of the three-task operators, with their guarantees: it skips
    when the job is STOPPED or a scheduled run falls in the minimum pause, fails without
    retry when the job is FAILED or the input is refused, takes a savepoint when the run's
    params ask for one, and emits an Asset event for every sink on completion. XCom: the
    plan under ``plan``, the step's ack under ``ack`` (or its decline under ``decline``),
    and returns ``{"checkpoint_id": n, ...}`` with the checkpoint's statistics.

    A failed try aborts its checkpoint before it ends (counted with the step's decline
    reason, or ``finalize_failure``), and an Airflow retry cuts a new barrier with a new
    id; a checkpoint a try left open (a killed worker) is aborted as ``abandoned`` by the
    retry's trigger, which re-enters this run's lease. A retry after the try died past
    ``_metadata`` does not abort: it finishes that checkpoint's commit (idempotent) and
    ends, as this run's checkpoint is complete. A refused plan or document fails without retry.

    :param job: The checkpointed job (built by ``CheckpointedPipeline`` at DAG-parse time).
    :param step: Name of the job's only step.
    """

    ui_color = "#e5dbff"

    def __init__(self, *, job: CheckpointJob, step: str, **kwargs: Any) -> None:
        kwargs.setdefault("outlets", sink_assets(job))
        super().__init__(job=job, step=step, trigger_task_id="", **kwargs)

    def execute(self, context: Context) -> JsonDict:
        ti = context["ti"]
        with fault_scope(attempt=int(ti.try_number)):
            plan = self._completed_by_earlier_try(context["run_id"]) if int(ti.try_number) > 1 else None
            if plan is not None:
                self.log.info("checkpoint %d of this run is complete: finishing its commit", plan.checkpoint_id)
                ti.xcom_push(key=PLAN_KEY, value=plan.to_dict())
                return self._commit(context, plan, [])
            plan = trigger_checkpoint(self, self.job, context)
            ti.xcom_push(key=PLAN_KEY, value=plan.to_dict())
            try:
                ack = self._step(ti, plan)
            except Exception:
                self._abort_declined(context, plan)
                raise
            ti.xcom_push(key=ACK_KEY, value=ack.to_dict())
            return self._commit(context, plan, [ack])

    def _commit(self, context: Context, plan: CheckpointPlan, acks: list[Any]) -> JsonDict:
        """Finalize; an aborted checkpoint is retried with a new barrier, a refused document is not."""
        try:
            return commit_checkpoint(self.job, context, self.outlets, plan, acks, {})
        except CheckpointAbortedError:
            raise
        except CheckpointError as e:
            raise AirflowFailException(str(e)) from e

    def _abort_declined(self, context: Context, plan: CheckpointPlan) -> None:
        """Abort ``plan`` with the decline the failed step pushed, as the three-task finalize does."""
        decline = context["ti"].xcom_pull(task_ids=self.task_id, key=DECLINE_KEY)
        try:
            commit_checkpoint(self.job, context, [], plan, [None], {self.step: decline} if decline else {})
        except CheckpointAbortedError:
            pass  # aborted and counted, as expected
        except Exception:  # the retry's trigger aborts it as abandoned
            self.log.exception("could not abort checkpoint %d after its step failed", plan.checkpoint_id)

    def _completed_by_earlier_try(self, run_id: str) -> CheckpointPlan | None:
        """The plan of this run's checkpoint if an earlier try wrote its ``_metadata``, else None."""
        try:
            return CompletedCheckpointStore(self.job.storage()).completed_plan_of(run_id)
        except DocumentError as e:
            raise AirflowFailException(f"refusing the plan of an earlier try of run {run_id}: {e}") from e
