"""Storage audit: a quiescent job directory holds its retained checkpoints and nothing else.

Use it after a sequence of runs (tests do) or in operations to find leftovers: files of
aborted or discarded checkpoints, staged sink data nobody will commit, a stale lease.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

from airflow_provider_checkpoint.dataflow.graph import Sink
from airflow_provider_checkpoint.exceptions import CheckpointError, MetadataError, UnsafePathError
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore
from airflow_provider_checkpoint.storage.job_records import JobRecordStore
from airflow_provider_checkpoint.storage.job_storage import (
    JOB_FILE,
    LEASE_FILE,
    METADATA,
    PLAN_FILE,
    RESTORE_REQUEST,
    SOURCES_DIR,
    STATS_DIR,
)

_JOB_FILES = {
    JOB_FILE,
    STATS_DIR,
    RESTORE_REQUEST,
    SOURCES_DIR,
    "dead_letters",
}  # dead_letters: the default dead-letter tables
_CHECKPOINT_FILES = {METADATA, PLAN_FILE}


def audit_job(storage: JobStorage, retained: int, sinks: Sequence[Sink] = ()) -> list[str]:
    """Findings (empty when clean) for a job with no checkpoint in flight.

    Checks: no lease; at most ``retained`` completed checkpoints; every ``_metadata``
    readable; every referenced state file present and intact; no file that no retained
    checkpoint references; no staged output left in ``sinks``; no link out of the job
    directory or a table (reported, never followed).
    """
    findings: list[str] = []
    fs = storage.fs
    if not fs.exists(storage.job_dir):
        return [f"{storage.url()} does not exist"]
    if storage.exists(LEASE_FILE):
        findings.append(f"stale lease {storage.url('_lease')}: {JobRecordStore(storage).lease_holder()}")
    completed = []
    store = CompletedCheckpointStore(storage)
    for checkpoint_id in storage.checkpoint_ids():
        try:
            if store.is_completed(checkpoint_id):
                completed.append(store.load(checkpoint_id))
        except (MetadataError, UnsafePathError) as e:
            findings.append(str(e))
    if len(completed) > retained:
        ids = ", ".join(str(c.checkpoint_id) for c in completed)
        findings.append(
            f"{storage.url()}: {len(completed)} completed checkpoints retained ({ids}), expected at most {retained}"
        )
    referenced = set().union(*(c.referenced_paths() for c in completed))
    for checkpoint in completed:
        for sink in sinks:
            if sink.uid in checkpoint.sinks:
                try:
                    referenced |= sink.job_files(checkpoint.checkpoint_id, checkpoint.sinks[sink.uid])
                except CheckpointError as e:  # a forged committable: its file is not vouched for
                    findings.append(str(e))
    for checkpoint in completed:
        for state in checkpoint.operators.values():
            for handle in state.handles:
                try:
                    storage.verify(handle)
                except Exception as e:  # noqa: BLE001 - every problem is a finding
                    findings.append(str(e))
    for entry in fs.ls(storage.job_dir, detail=False):
        name = posixpath.basename(entry.rstrip("/"))
        try:  # never walk a link out of the job directory: report it
            storage.path(name)
        except UnsafePathError as e:
            findings.append(str(e))
            continue
        if name in _JOB_FILES or name == LEASE_FILE:
            continue
        if not storage.is_chk_dir(name):
            findings.append(f"unexpected entry {storage.url(name)}")
            continue
        links_out = len(findings)
        files = storage.files_under(name, findings)
        if not files and len(findings) == links_out:
            findings.append(f"empty leftover directory {storage.url(name)}")
        for relative in files:
            is_metadata = posixpath.basename(relative) in _CHECKPOINT_FILES and storage.exists(f"{name}/{METADATA}")
            if relative not in referenced and not is_metadata:
                findings.append(f"orphaned file {storage.url(relative)}")
    for sink in sinks:
        sink.bind_job(storage.job_id)
        try:
            findings.extend(sink.audit())
        except CheckpointError as e:  # a table refused as a whole (a link in its log, a damaged log)
            findings.append(f"sink {sink.uid}: {e}")
    return list(dict.fromkeys(findings))
