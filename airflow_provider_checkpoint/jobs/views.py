"""The reports of one job as the Checkpoints page's routes and ``airflow checkpoints`` show them: the
pure report functions (:mod:`.overview`, :mod:`.checkpoint_detail`, :mod:`.in_progress`,
:mod:`.configuration`) fed with the job's stored documents and what Airflow's database knows
(:mod:`.runs`). The API server and the CLI call the same functions.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow_provider_checkpoint.core import stats
from airflow_provider_checkpoint.core.documents import JsonDict, load_json
from airflow_provider_checkpoint.exceptions import CheckpointError, shorten
from airflow_provider_checkpoint.jobs import reports, values
from airflow_provider_checkpoint.jobs.checkpoint_detail import checkpoint_detail
from airflow_provider_checkpoint.jobs.configuration import configuration
from airflow_provider_checkpoint.jobs.in_progress import in_progress
from airflow_provider_checkpoint.jobs.overview import overview, summary
from airflow_provider_checkpoint.jobs.registry import JobLocation
from airflow_provider_checkpoint.jobs.runs import DagFacts, RunFacts, dag_facts, run_facts
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore
from airflow_provider_checkpoint.storage.job_records import JobRecordStore
from airflow_provider_checkpoint.storage.stats import StatsStore

log = logging.getLogger(__name__)


def _dag(location: JobLocation) -> DagFacts:
    try:
        return dag_facts(location.dag_id)
    except Exception as e:  # noqa: BLE001 - no database (or not this Airflow's): unknown, never an error
        log.warning("cannot read DAG %s from Airflow's database: %s", location.dag_id, shorten(e))
        return DagFacts()


def _run(location: JobLocation, run_id: str, xcom_keys: tuple[str, ...] = ()) -> RunFacts:
    if not run_id:
        return RunFacts()
    try:
        return run_facts(location.dag_id, run_id, None, xcom_keys)
    except Exception as e:  # noqa: BLE001 - as above
        log.warning("cannot read run %s of DAG %s from Airflow's database: %s", run_id, location.dag_id, shorten(e))
        return RunFacts()


def _plan(storage: JobStorage, checkpoint_id: int) -> Any:
    """The stored plan of ``checkpoint_id`` (untrusted JSON), ``None`` when absent or unreadable."""
    path = storage.plan_path(checkpoint_id)
    try:
        return load_json(storage.read_bytes(path), storage.url(path)) if storage.has_file(path) else None
    except CheckpointError:
        return None


def _topology(storage: JobStorage) -> Any:
    """The job's recorded topology (untrusted), ``None`` when ``_job.json`` is unreadable."""
    try:
        return JobRecordStore(storage).load().topology
    except CheckpointError:
        return None


def _lease(storage: JobStorage) -> Any:
    try:
        return JobRecordStore(storage).lease_holder()
    except CheckpointError:
        return None


def _newest_plan(storage: JobStorage) -> Any:
    """The plan of the newest planned checkpoint if it has no stats record yet."""
    for checkpoint_id in reversed(storage.checkpoint_ids()):
        plan = _plan(storage, checkpoint_id)
        if plan is not None:
            return None if storage.has_file(storage.stats_path(checkpoint_id)) else plan
    return None


def in_progress_of(location: JobLocation, storage: JobStorage | None = None) -> JsonDict | None:
    """The checkpoint in flight, with its acks per step and the lease holder; ``None`` when there is none."""
    storage = storage or location.storage()
    plan = _newest_plan(storage)
    if plan is None:
        return None
    chained = _dag(location).chained_task
    run_id = stats.text(plan.get("run_id") if isinstance(plan, dict) else None, 500)
    facts = _run(location, run_id, ("return_value", "ack"))
    return in_progress(plan, _lease(storage), facts, chained)


def overview_of(location: JobLocation) -> JsonDict:
    storage = location.storage()
    return overview(
        reports.all_rows(storage),
        reports.savepoints(storage),
        in_progress_of(location, storage) is not None,
        lambda checkpoint_id: storage.url(storage.metadata_path(checkpoint_id)),
    )


def summary_of(location: JobLocation) -> JsonDict:
    return summary(reports.all_rows(location.storage()))


def configuration_of(location: JobLocation) -> JsonDict:
    storage = location.storage()
    settings = {"retained_checkpoints": location.retained(), **(location.settings or {})}
    return configuration(settings, _topology(storage), storage.url(), _dag(location))


def _completed_record(storage: JobStorage, checkpoint_id: int) -> JsonDict | None:
    """The record a completed checkpoint gets, from its ``_metadata`` (when its stats record is not written yet)."""
    store = CompletedCheckpointStore(storage)
    try:
        completed = store.load(checkpoint_id) if store.is_completed(checkpoint_id) else None
    except CheckpointError:
        return None
    return None if completed is None else stats.completed(completed)


def _planned_record(checkpoint_id: int, plan: Any) -> JsonDict | None:
    """What a checkpoint's plan says of it (id, run, type, trigger time) while it has no record."""
    if not isinstance(plan, dict):
        return None
    barrier = {k: v for k, v in values.mapping(plan.get("barrier")).items() if k in ("type", "trigger_time")}
    return {**barrier, "checkpoint_id": checkpoint_id, "run_id": plan.get("run_id")}


def detail_of(location: JobLocation, checkpoint_id: int) -> JsonDict | None:
    """The detail of checkpoint ``checkpoint_id``; ``None`` when the job has no trace of it."""
    storage = location.storage()
    plan = _plan(storage, checkpoint_id)
    recorded = StatsStore(storage).load(checkpoint_id)
    record = recorded or _completed_record(storage, checkpoint_id) or _planned_record(checkpoint_id, plan)
    if record is None:
        return None
    chained = _dag(location).chained_task
    facts = _run(location, stats.text(record.get("run_id"), 500), ("return_value", "ack"))
    status = None
    if recorded is None and plan is not None and in_progress(plan, _lease(storage), facts, chained):
        status = "IN_PROGRESS"
    metadata = storage.metadata_path(checkpoint_id)
    return checkpoint_detail(
        record,
        dag_id=location.dag_id,
        metadata_url=storage.url(metadata) if storage.has_file(metadata) else None,
        facts=facts,
        topology=_topology(storage),
        plan_steps=values.mapping(plan).get("steps"),
        chained_task=chained,
        status=status,
    )
