"""What Airflow's metadata database knows about a checkpointed job's DAG and runs: the tries of
a run's tasks, the acks its steps pushed to XCom, the DAG's schedule and whether it is chained.

The reports (:mod:`.checkpoint_detail`, :mod:`.in_progress`, :mod:`.configuration`) are pure
functions of these facts and the job's stored documents; only this module talks to the
database (the API server's and the CLI's, through Airflow's own session). Values read here are
type-checked like any stored document: XCom values are whatever a task pushed.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_checkpoint.core.documents import JsonDict
from airflow_provider_checkpoint.jobs import values

CHAINED_OPERATOR = "ChainedCheckpointOperator"


@dataclass(frozen=True)
class RunFacts:
    """One DAG run as Airflow's database has it; empty when it is not there (or not asked)."""

    state: str | None = None
    tries: dict[str, list[JsonDict]] = field(default_factory=dict)
    """Task id → its attempts ``{"try_number", "state", "start", "end", "duration"}``, by try number."""
    xcoms: dict[tuple[str, str], tuple[Any, float | None]] = field(default_factory=dict)
    """``(task id, key)`` → the pushed value and when it was pushed."""


@dataclass(frozen=True)
class DagFacts:
    """A DAG as Airflow last parsed it (nothing of the DAG file runs to know this)."""

    schedule: str | None = None
    chained: bool | None = None
    chained_task: str | None = None
    """The task running trigger, step and finalize of a chained pipeline (``chain=True``)."""


def _epoch(moment: Any) -> float | None:
    return values.seconds(moment.timestamp()) if isinstance(moment, datetime.datetime) else None


def attempt(try_number: Any, state: Any, start: Any, end: Any, duration: Any) -> JsonDict | None:
    """One try of a task from database columns; ``None`` without a valid try number."""
    if values.positive(try_number) is None:
        return None
    state_text = getattr(state, "value", state)
    return {
        "try_number": try_number,
        "state": values.text_or_none(state_text, 40),
        "start": _epoch(start),
        "end": _epoch(end),
        "duration": values.number(duration),
    }


def run_facts(
    dag_id: str, run_id: str, task_ids: Iterable[str] | None = None, xcom_keys: Iterable[str] = ()
) -> RunFacts:
    """The state of run ``run_id`` of ``dag_id``, the tries of ``task_ids`` (default: every task) and their
    XComs of ``xcom_keys``."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.taskinstancehistory import TaskInstanceHistory
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    tasks, keys = (None if task_ids is None else sorted(set(task_ids))), sorted(set(xcom_keys))
    tries: dict[str, dict[int, JsonDict]] = {}
    xcoms: dict[tuple[str, str], tuple[Any, float | None]] = {}
    with create_session() as session:
        state = session.scalar(select(DagRun.state).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
        for model in (TaskInstanceHistory, TaskInstance):  # the current try wins over its history
            query = select(
                model.task_id, model.try_number, model.state, model.start_date, model.end_date, model.duration
            ).where(model.dag_id == dag_id, model.run_id == run_id, model.map_index == -1)
            if tasks is not None:
                query = query.where(model.task_id.in_(tasks))
            for task_id, *columns in session.execute(query):
                if (one := attempt(*columns)) is not None:
                    tries.setdefault(task_id, {})[one["try_number"]] = one
        if keys:
            query = select(XComModel.task_id, XComModel.key, XComModel.value, XComModel.timestamp).where(
                XComModel.dag_id == dag_id,
                XComModel.run_id == run_id,
                XComModel.map_index == -1,
                XComModel.key.in_(keys),
            )
            if tasks is not None:
                query = query.where(XComModel.task_id.in_(tasks))
            for row in session.execute(query):
                xcoms[(row.task_id, row.key)] = (_xcom_value(row), _epoch(row.timestamp))
    return RunFacts(
        state=values.text_or_none(getattr(state, "value", state), 40),
        tries={t: [byno[n] for n in sorted(byno)] for t, byno in tries.items()},
        xcoms=xcoms,
    )


def _xcom_value(row: Any) -> Any:
    from airflow.models.xcom import XComModel

    try:
        return XComModel.deserialize_value(row)
    except Exception:  # noqa: BLE001 - whatever a task pushed: unreadable is no ack
        return None


def dag_paused(dag_id: str) -> bool | None:
    """Whether ``dag_id`` is paused in Airflow (``None``: Airflow does not know the DAG)."""
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        model = session.get(DagModel, dag_id)
        return None if model is None else bool(model.is_paused)


def dag_facts(dag_id: str) -> DagFacts:
    """The schedule Airflow shows for ``dag_id`` and whether its checkpoint runs in one chained task."""
    from airflow.models.dag import DagModel
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        model = session.get(DagModel, dag_id)
        schedule = values.text_or_none(model.timetable_summary, 250) if model is not None else None
        schedule = None if schedule == "None" else schedule  # no schedule, as Airflow's REST API answers it
        try:
            dag = SerializedDagModel.get_dag(dag_id, session=session)
        except Exception:  # noqa: BLE001 - a serialized DAG this Airflow cannot read: unknown
            dag = None
    if dag is None:
        return DagFacts(schedule)
    chained_task = next((t.task_id for t in dag.tasks if t.task_type == CHAINED_OPERATOR), None)
    return DagFacts(schedule, chained_task is not None, chained_task)
