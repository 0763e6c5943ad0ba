"""Sensors of checkpointed jobs, each in poke and deferrable form.

``deferrable`` defaults to ``[operators] default_deferrable``. Deferred, the wait runs
in the triggerer (:mod:`airflow_provider_checkpoint.triggers.checkpoint`) and frees the
worker slot; a sensor checks once before deferring, so a condition already true costs
no trip through the triggerer.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseSensorOperator, Context, PokeReturnValue, conf
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_provider_checkpoint.core.model import JsonDict
from airflow_provider_checkpoint.exceptions import CheckpointError
from airflow_provider_checkpoint.hooks.checkpoint import CheckpointStorageHook
from airflow_provider_checkpoint.jobs.definition import CheckpointJob
from airflow_provider_checkpoint.storage.config import default_storage_root
from airflow_provider_checkpoint.triggers.checkpoint import (
    CheckpointCompletedTrigger,
    CheckpointInputTrigger,
    source_spec,
)


def _default_deferrable(deferrable: bool | None) -> bool:
    if deferrable is not None:
        return deferrable
    return conf.getboolean("operators", "default_deferrable", fallback=False)


class _DeferrableSensor(BaseSensorOperator):
    """Poke mode through :class:`BaseSensorOperator`; deferred through ``_trigger()``.

    :param deferrable: Wait in the triggerer instead of a worker slot
        (default ``[operators] default_deferrable``).
    """

    def __init__(self, *, deferrable: bool | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.deferrable = _default_deferrable(deferrable)

    def _found(self) -> JsonDict | None:
        raise NotImplementedError

    def _trigger(self) -> Any:
        raise NotImplementedError

    def _checked(self) -> JsonDict | None:
        """``_found()``; a refused document or unreadable storage fails the sensor without retry."""
        try:
            return self._found()
        except CheckpointError as e:
            raise AirflowFailException(f"{self.task_id}: {e}") from e

    def poke(self, context: Context) -> bool | PokeReturnValue:
        found = self._checked()
        return PokeReturnValue(is_done=True, xcom_value=found) if found is not None else False

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        found = self._checked()
        if found is not None:
            return found
        self.defer(
            trigger=self._trigger(),
            method_name="execute_complete",
            timeout=datetime.timedelta(seconds=self.timeout),
        )

    def execute_complete(self, context: Context, event: JsonDict | None = None) -> JsonDict:
        if event and event.get("status") == "refused":
            raise AirflowFailException(f"{self.task_id}: {event.get('message')}")
        if not event or event.get("status") != "success":
            raise AirflowException(f"{self.task_id}: {(event or {}).get('message', 'trigger ended without event')}")
        self.log.info("%s: condition met: %s", self.task_id, event)
        return {k: v for k, v in event.items() if k != "status"}


class CheckpointInputSensor(_DeferrableSensor):
    """Waits until a pipeline's sources hold input beyond its latest completed checkpoint.

    Returns (XCom) ``{"sources": [uid, ...]}``: the sources with new input. A pending
    restore request counts as input. ``CheckpointedPipeline(wait_for_input=...)`` puts
    this sensor, with ``soft_fail``, in front of the trigger: a run without new input
    is skipped instead of producing an empty checkpoint. Deferred, it watches only
    :class:`~airflow_provider_checkpoint.connectors.files.source.FileSource` and
    :class:`~airflow_provider_checkpoint.connectors.delta.source.DeltaSource` sources.

    :param job: The checkpointed job whose sources it watches.
    :param deferrable: Wait in the triggerer instead of a worker slot
        (default ``[operators] default_deferrable``).
    """

    ui_color = "#fff2cc"

    def __init__(self, *, job: CheckpointJob, **kwargs: Any) -> None:
        kwargs.setdefault("poke_interval", 30.0)
        super().__init__(**kwargs)
        self.job = job

    def _found(self) -> JsonDict | None:
        hook = CheckpointStorageHook(self.job.job_id, self.job.storage_root, self.job.storage_conn_id)
        found = hook.new_input(self.job.graph.sources)
        self.log.info("job %s: new input in %s", self.job.job_id, found or "no source")
        return {"sources": found} if found else None

    def _trigger(self) -> CheckpointInputTrigger:
        return CheckpointInputTrigger(
            job_id=self.job.job_id,
            storage_root=self.job.storage_root or default_storage_root(),
            storage_conn_id=self.job.storage_conn_id,
            sources=[source_spec(s) for s in self.job.graph.sources],
            poke_interval=float(self.poke_interval),
        )


class CheckpointCompletedSensor(_DeferrableSensor):
    """For downstream DAGs: waits until ``job_id`` has committed a checkpoint newer than
    ``after_checkpoint_id``, or (``None``) newer than the latest one when the sensor starts.

    With ``savepoint=True`` it waits for a savepoint instead. A checkpoint counts once
    its sinks are committed, so the next task reads its output from the tables. Returns
    (XCom) ``{"checkpoint_id": n, ...}`` (``"savepoint": path`` for a savepoint).
    Reschedule mode needs an explicit ``after_checkpoint_id`` (a rescheduled sensor
    starts afresh).

    :param job_id: The job to watch (the pipeline's ``job_id``, by default its dag_id). (templated)
    :param after_checkpoint_id: Wait for a checkpoint newer than this id; ``None`` or empty:
        newer than the latest one when the sensor starts. (templated)
    :param savepoint: Wait for a savepoint instead of a checkpoint.
    :param storage: URL of the checkpoint storage root holding the job
        (default ``[checkpoint] storage_root``). (templated)
    :param storage_conn_id: Airflow connection for the storage root's filesystem. (templated)
    :param deferrable: Wait in the triggerer instead of a worker slot
        (default ``[operators] default_deferrable``).
    """

    template_fields: Sequence[str] = ("job_id", "after_checkpoint_id", "storage", "storage_conn_id")
    ui_color = "#e2f0d9"

    def __init__(
        self,
        *,
        job_id: str,
        after_checkpoint_id: int | str | None = None,
        savepoint: bool = False,
        storage: str | None = None,
        storage_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("poke_interval", 30.0)
        super().__init__(**kwargs)
        if after_checkpoint_id is None and self.mode == "reschedule":
            raise ValueError(f"{self.task_id}: mode='reschedule' needs an explicit after_checkpoint_id")
        self.job_id = job_id
        self.after_checkpoint_id = after_checkpoint_id
        self.savepoint = savepoint
        self.storage = storage
        self.storage_conn_id = storage_conn_id
        self._after: int | None = None

    def _storage_root(self) -> str:
        return self.storage or default_storage_root()

    def _hook(self) -> CheckpointStorageHook:
        return CheckpointStorageHook(self.job_id, self._storage_root(), self.storage_conn_id)

    def execute(self, context: Context) -> Any:
        if self.after_checkpoint_id is None or self.after_checkpoint_id == "":
            self._after = self._hook().latest_committed_id()
        else:
            try:
                self._after = int(self.after_checkpoint_id)
            except ValueError as e:
                raise AirflowFailException(f"{self.task_id}: after_checkpoint_id must be an integer, got {e}") from e
        kind = "savepoint" if self.savepoint else "checkpoint"
        self.log.info("waiting for a %s of job %s newer than checkpoint %d", kind, self.job_id, self._after)
        return super().execute(context)

    def _found(self) -> JsonDict | None:
        assert self._after is not None
        return self._hook().committed_after(self._after, self.savepoint)

    def _trigger(self) -> CheckpointCompletedTrigger:
        assert self._after is not None
        return CheckpointCompletedTrigger(
            job_id=self.job_id,
            storage_root=self._storage_root(),
            storage_conn_id=self.storage_conn_id,
            after_checkpoint_id=self._after,
            savepoint=self.savepoint,
            poke_interval=float(self.poke_interval),
        )
