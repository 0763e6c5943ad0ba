"""What a person does with a job's snapshots: read their state, restore the job from one."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.connectors.files.parquet_files import check_table_committables
from airflow_provider_checkpoint.connectors.files.parquet_sink import FORMAT as TABLE_FORMAT
from airflow_provider_checkpoint.core.documents import MAX_ID
from airflow_provider_checkpoint.core.model import (
    RestoreRequest,
)
from airflow_provider_checkpoint.exceptions import CheckpointStorageError, shorten
from airflow_provider_checkpoint.state.files import read_table
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.storage.job_storage import JOB_FILE, METADATA
from airflow_provider_checkpoint.storage.paths import resolve_under_roots

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession


from airflow_provider_checkpoint.exceptions import RestoreError
from airflow_provider_checkpoint.restore.snapshot import check_compatible, open_snapshot, verify_state
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore
from airflow_provider_checkpoint.storage.job_records import JobRecordStore

_ID = re.compile(r"^[0-9]+$")


def read_state(
    pointer: str, operator_uid: str, spark: SparkSession | None = None, *, conn_id: str | None = None
) -> pa.Table | DataFrame:
    """The keyed state of ``operator_uid`` in a checkpoint or savepoint, after checksum verification.

    ``pointer`` is a checkpoint or savepoint directory, or its ``_metadata``; on S3 ``conn_id``
    names the Airflow ``aws`` connection to read it with (else the standard AWS environment).
    Returns a pyarrow Table, or a Spark DataFrame when ``spark`` is given.
    """
    options: dict[str, Any] = {} if conn_id is None else {"conn_id": conn_id}
    snapshot = open_snapshot(pointer, **options)
    state = snapshot.checkpoint.operators.get(operator_uid)
    if state is None:
        known = ", ".join(sorted(snapshot.checkpoint.operators)) or "none"
        raise KeyError(f"{snapshot.location.url()} has no state for operator {operator_uid!r} (it has: {known})")
    verify_state(snapshot.base, operator_uid, state)
    if spark is not None:
        from airflow_provider_checkpoint.state.spark_backend import read_state as read_spark_state

        return read_spark_state(spark, snapshot.base, state, uid=operator_uid)
    return read_table(snapshot.base, state, operator_uid)


def resolve_pointer(storage: JobStorage, checkpoint: str, roots: Sequence[str]) -> str:
    """The URL of the snapshot named by a restore DAG's ``checkpoint`` param.

    ``latest`` (the newest completed checkpoint of the job), a checkpoint id, or a path
    to a checkpoint or savepoint directory (or its ``_metadata``) under ``roots``; a value
    with surrounding whitespace (``"3 "``, ``"latest\\n"``) is refused, never trimmed.
    """
    value = str(checkpoint)
    if value != value.strip():
        raise RestoreError(
            f"checkpoint {shorten(value)} has surrounding whitespace: give 'latest', an id or a path exactly"
        )
    if value in ("", "latest"):
        ids = CompletedCheckpointStore(storage).completed_ids()
        if not ids:
            raise CheckpointStorageError(f"job {storage.job_id} has no completed checkpoint in {storage.url()}")
        return storage.url(storage.chk_dir(ids[-1]))
    if _ID.fullmatch(value):
        digits = value
        if len(digits) > len(str(MAX_ID)) or int(digits) > MAX_ID:
            raise RestoreError(f"checkpoint: id {digits[:30]}… is larger than any checkpoint id ({MAX_ID})")
        checkpoint_id = int(digits)
        store = CompletedCheckpointStore(storage)
        if not store.is_completed(checkpoint_id):
            known = ", ".join(map(str, store.completed_ids())) or "none"
            raise CheckpointStorageError(
                f"job {storage.job_id} has no completed checkpoint {checkpoint_id} (retained: {known})"
            )
        return storage.url(storage.chk_dir(checkpoint_id))
    return resolve_under_roots(value, roots)


def request_restore(storage: JobStorage, pointer: str, allow_non_restored_state: bool, dry_run: bool) -> dict[str, Any]:
    """Validate the snapshot at ``pointer`` for the job, then (unless ``dry_run``) request the restore.

    The request (``_restore.json``) is taken by the next checkpoint of the job; the job
    is set RUNNING with a clean failure count. Nothing is written when validation fails.
    """
    snapshot = open_snapshot(pointer, storage)
    snapshot.verify()
    records = JobRecordStore(storage)
    job = records.load()
    nodes = job.topology.get("nodes", {})
    stateful = {uid: n.get("keys", []) for uid, n in nodes.items() if n.get("kind") == "stateful"}
    if not nodes:
        raise RestoreError(
            f"job {storage.job_id} has no recorded topology in {storage.url(JOB_FILE)}: has it ever run here?"
        )
    declared = {uid: n["state"] for uid, n in nodes.items() if uid in stateful and isinstance(n.get("state"), dict)}
    starting_empty = check_compatible(snapshot, storage.job_id, stateful, allow_non_restored_state, declared)
    cp = snapshot.checkpoint
    for uid, committables in sorted(cp.sinks.items()):
        node = nodes.get(uid, {})
        if node.get("format") == TABLE_FORMAT:
            check_table_committables(
                cp.checkpoint_id, committables, node.get("mode", ""), snapshot.location.url(METADATA), f"sinks.{uid}"
            )
    summary: dict[str, Any] = {
        "job_id": storage.job_id,
        "dag_id": job.topology.get("dag_id", storage.job_id),
        "snapshot": snapshot.location.url(),
        "checkpoint_id": cp.checkpoint_id,
        "type": cp.type.value,
        "operators_restored": sorted(set(cp.operators) & set(stateful)),
        "operators_dropped": sorted(set(cp.operators) - set(stateful)),
        "operators_starting_empty": starting_empty,
        "dry_run": dry_run,
    }
    if not dry_run:
        records.write_restore_request(
            RestoreRequest(
                request_id=uuid.uuid4().hex,
                location_url=snapshot.location.url(),
                checkpoint_id=cp.checkpoint_id,
                allow_non_restored_state=allow_non_restored_state,
                requested_at=time.time(),
            )
        )
        job.resume()
        records.save(job)
    return summary
