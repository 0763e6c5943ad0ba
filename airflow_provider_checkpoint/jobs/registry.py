"""Where every checkpointed job lives: the job registry under the default storage root.

A pipeline may keep its checkpoints under its own ``storage=`` root and
``storage_conn_id``. Its trigger task records that location in
``<default storage_root>/_registry/<job_id>.json``, so the restore DAG, the CLI and the
Checkpoints page find the job without parsing any DAG file (the API server and the CLI
never run pipeline code). Jobs under the default root are found even without an entry.

Registry entries are untrusted: each is validated on read (shape, names, a plain
storage URL of a served scheme without a password, checked before anything is opened)
and the job must really live where its entry says (its ``_job.json`` names the same
job), else a :class:`RegistryError` names the file.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import posixpath
import re
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from airflow_provider_checkpoint.core.documents import JOB_ID, load_json
from airflow_provider_checkpoint.core.job_record import JobRecord
from airflow_provider_checkpoint.exceptions import DocumentError, JobRecordError, RegistryError, shorten
from airflow_provider_checkpoint.storage import Location
from airflow_provider_checkpoint.storage.config import storage_url_problem
from airflow_provider_checkpoint.storage.job_records import JobRecordStore
from airflow_provider_checkpoint.storage.job_storage import JOB_FILE

if TYPE_CHECKING:
    from airflow_provider_checkpoint.dataflow.graph import Sink
    from airflow_provider_checkpoint.hooks.checkpoint import CheckpointStorageHook
    from airflow_provider_checkpoint.jobs.definition import CheckpointJob
    from airflow_provider_checkpoint.storage import JobStorage

REGISTRY_DIR = "_registry"
REGISTRY_VERSION = 1
_CONN_ID = re.compile(r"^[A-Za-z0-9_.-]{1,250}$")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobLocation:
    """A job and where its files are: ``<storage_root>/<job_id>/`` (``None``: the default root)."""

    job_id: str
    dag_id: str
    storage_root: str | None = None
    storage_conn_id: str | None = None
    retained_checkpoints: int | None = None
    settings: dict[str, Any] | None = field(default=None, compare=False)
    """The checkpoint settings the job's last trigger ran with (``CheckpointSettings`` fields, untrusted:
    :mod:`.configuration` type-checks each); ``None`` in entries written before they were recorded."""

    def hook(self) -> CheckpointStorageHook:
        from airflow_provider_checkpoint.hooks.checkpoint import CheckpointStorageHook

        return CheckpointStorageHook(self.job_id, self.storage_root, self.storage_conn_id)

    def storage(self) -> JobStorage:
        return self.hook().get_storage()

    def allowed_roots(self) -> list[str]:
        """Where restore paths of this job may point: the savepoint roots and its storage root."""
        from airflow_provider_checkpoint.storage.config import allowed_roots

        return allowed_roots(self.storage_root)

    def deployed_sinks(self) -> list[Sink]:
        """The sinks of this job as its DAG declares them now: the DAG file Airflow last parsed
        ``dag_id`` from is executed, as the scheduler parses it. :class:`RegistryError` when the
        DAG or a step of this job in it cannot be found."""
        from airflow.models.dag import DagModel

        from airflow_provider_checkpoint.spark.submit import StepTask, load_dag

        model = DagModel.get_dagmodel(self.dag_id)
        if model is None or not model.fileloc:
            raise RegistryError(f"DAG {self.dag_id} of job {self.job_id} is not in Airflow's metadata database")
        try:
            dag = load_dag(model.fileloc, self.dag_id)
        except Exception as e:  # the user's DAG file: any error it raises
            raise RegistryError(f"DAG {self.dag_id} of job {self.job_id} failed to load: {shorten(e)}") from e
        jobs = {task.job.job_id: task.job for task in dag.tasks if isinstance(task, StepTask)}
        if self.job_id not in jobs:
            raise RegistryError(f"DAG {self.dag_id} ({model.fileloc}) runs no step of job {self.job_id}")
        return list(jobs[self.job_id].graph.sinks)

    def retained(self) -> int:
        from airflow_provider_checkpoint.storage.config import config_value

        return self.retained_checkpoints or int(config_value("retained_checkpoints", "3"))


def _default_root() -> Location:
    from airflow_provider_checkpoint.storage.config import default_storage_root, storage_location

    return storage_location(default_storage_root())


def _registry() -> Location:
    root = _default_root()
    return Location(root.fs, root.path(REGISTRY_DIR))


def register(job: CheckpointJob) -> None:
    """Record where ``job`` lives (rewritten only when it changed); the trigger task calls this."""
    entry = JobLocation(
        job_id=job.job_id,
        dag_id=job.dag_id or job.job_id,
        storage_root=job.storage_root,
        storage_conn_id=job.storage_conn_id,
        retained_checkpoints=job.resolved_settings().retained_checkpoints,
        settings=dataclasses.asdict(job.resolved_settings()),
    )
    data = json.dumps({"version": REGISTRY_VERSION, **asdict(entry)}, indent=1, sort_keys=True).encode()
    registry = _registry()
    name = f"{job.job_id}.json"
    if not registry.exists(name) or registry.read_bytes(name) != data:
        registry.write_atomic(name, data)


def decode_entry(data: bytes, source: str, job_id: str) -> JobLocation:
    """Validate one registry entry (the file of ``job_id``); raise :class:`RegistryError` naming ``source``."""
    try:
        d = load_json(data, source)
    except DocumentError as e:
        raise RegistryError(str(e)) from e
    if not isinstance(d, dict) or d.get("version") != REGISTRY_VERSION:
        raise RegistryError(f"{source}: not a version-{REGISTRY_VERSION} registry entry")
    problems = []
    if d.get("job_id") != job_id:
        problems.append(f"job_id {d.get('job_id')!r} does not match the file name")
    dag_id = d.get("dag_id")
    if not isinstance(dag_id, str) or not JOB_ID.match(dag_id):
        problems.append(f"dag_id {dag_id!r} is not a DAG id")
    root = d.get("storage_root")
    if root is not None and not _plain_url(root):
        problems.append(f"storage_root {shorten(root)} is not an absolute URL without '..'")
    elif root is not None and (problem := storage_url_problem(root)):
        problems.append(f"storage_root {problem}")
    conn_id = d.get("storage_conn_id")
    if conn_id is not None and not (isinstance(conn_id, str) and _CONN_ID.match(conn_id)):
        problems.append(f"storage_conn_id {conn_id!r} is not a connection id")
    retained = d.get("retained_checkpoints")
    if retained is not None and not (type(retained) is int and retained >= 1):
        problems.append(f"retained_checkpoints {retained!r} is not a positive integer")
    if problems:
        raise RegistryError(f"{source}: " + "; ".join(problems))
    settings = d.get("settings")
    return JobLocation(job_id, str(dag_id), root, conn_id, retained, settings if isinstance(settings, dict) else None)


def _plain_url(value: Any) -> bool:
    if not isinstance(value, str) or any(c in value for c in "\x00\\\n"):
        return False
    parts = urlsplit(value)
    path = parts.path if parts.scheme else value
    return path.startswith("/") and ".." not in path.split("/") and posixpath.normpath(path) != "/"


def _check_lives_there(location: JobLocation, source: str) -> JobLocation:
    storage = location.storage()
    if not storage.has_file(JOB_FILE):
        raise RegistryError(f"{source} says job {location.job_id} lives in {storage.url()}, but it has no _job.json")
    try:
        JobRecordStore(storage).load()  # refuses a record of another job
    except JobRecordError as e:
        raise RegistryError(
            f"{source} points to {storage.url()}, which does not hold job {location.job_id!r}: {e}"
        ) from e
    return location


def find_job(job_id: str) -> JobLocation:
    """The location of ``job_id``: its registry entry, else the default storage root."""
    if not JOB_ID.match(job_id or ""):
        raise RegistryError(f"{job_id!r} is not a job id (letters, digits, '_', '.', '-')")
    registry = _registry()
    name = f"{job_id}.json"
    if registry.exists(name):
        return _check_lives_there(
            decode_entry(registry.read_bytes(name), registry.url(name), job_id), registry.url(name)
        )
    root = _default_root()
    if not root.exists(f"{job_id}/{JOB_FILE}"):
        known = ", ".join(j.job_id for j in list_jobs()) or "none"
        raise RegistryError(
            f"unknown job {job_id!r}: not registered in {registry.url()} and not in {root.url()} (known jobs: {known})"
        )
    return _unregistered(root, job_id)


def _unregistered(root: Location, job_id: str) -> JobLocation:
    """A job under the default root without a registry entry; its DAG is the one its ``_job.json`` names."""
    try:
        dag_id = JobRecord.decode(
            root.read_bytes(f"{job_id}/{JOB_FILE}"), root.url(f"{job_id}/{JOB_FILE}")
        ).topology.get("dag_id")
    except JobRecordError as e:
        raise RegistryError(str(e)) from e
    return JobLocation(job_id, dag_id if isinstance(dag_id, str) and JOB_ID.match(dag_id) else job_id)


def list_jobs() -> list[JobLocation]:
    """Every job found: registered ones (malformed entries are skipped) and those under the default root."""
    found: dict[str, JobLocation] = {}
    root = _default_root()
    for name in _names(root):
        if JOB_ID.match(name) and root.exists(f"{name}/{JOB_FILE}"):
            try:
                found[name] = _unregistered(root, name)
            except RegistryError as e:
                log.warning("skipping job %s: %s", name, e)
    registry = _registry()
    for name in _names(registry):
        if name.endswith(".json") and JOB_ID.match(name[:-5]):
            try:
                found[name[:-5]] = decode_entry(registry.read_bytes(name), registry.url(name), name[:-5])
            except RegistryError as e:
                log.warning("skipping registry entry: %s", e)
    return [found[k] for k in sorted(found)]


def _names(location: Location) -> list[str]:
    if not location.fs.exists(location.base):
        return []
    return sorted(posixpath.basename(p.rstrip("/")) for p in location.fs.ls(location.base, detail=False))
