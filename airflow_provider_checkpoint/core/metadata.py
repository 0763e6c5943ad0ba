"""The versioned ``_metadata`` codec: JSON, never pickle; unknown versions are refused."""

from __future__ import annotations

import json

from airflow_provider_checkpoint.core.documents import JOB_ID, Fields, enum_value, load_json
from airflow_provider_checkpoint.core.model import (
    Barrier,
    CheckpointType,
    CompletedCheckpoint,
    checkpoint_options,
    sink_committables,
)
from airflow_provider_checkpoint.exceptions import DocumentError, MetadataError, shorten
from airflow_provider_checkpoint.state.handles import HandleScope, operator_snapshots

FORMAT = "airflow-checkpoint"
VERSION = 1


def encode(checkpoint: CompletedCheckpoint) -> bytes:
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "job_id": checkpoint.job_id,
        "checkpoint_id": checkpoint.checkpoint_id,
        "type": checkpoint.type.value,
        "trigger_time": checkpoint.trigger_time,
        "completion_time": checkpoint.completion_time,
        "restored_from": checkpoint.restored_from,
        "barrier": checkpoint.barrier.to_dict(),
        "operators": {uid: s.to_dict() for uid, s in sorted(checkpoint.operators.items())},
        "sinks": {uid: c for uid, c in sorted(checkpoint.sinks.items())},
        "stats": checkpoint.stats,
        "options": checkpoint.options,
        "relocatable": checkpoint.relocatable,
    }
    return json.dumps(doc, indent=1, sort_keys=True).encode()


def decode(data: bytes, source: str = "_metadata") -> CompletedCheckpoint:
    """Parse and validate ``_metadata``; ``source`` names the file in every error.

    State handles must lie where their layout puts them (:class:`HandleScope`); sink
    committables must be JSON objects (each sink checks their shape before it commits).
    """
    try:
        doc = load_json(data, source)
    except DocumentError as e:
        raise MetadataError(source, f"not valid JSON ({e}); the checkpoint is corrupt") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise MetadataError(source, f"not an {FORMAT} metadata file")
    version = doc.get("version")
    if version != VERSION:
        raise MetadataError(
            source,
            f"metadata version {shorten(version)} is not supported by this provider "
            f"(it reads version {VERSION}); upgrade airflow-provider-checkpoint to restore it",
        )
    try:
        f = Fields(doc, source)
        checkpoint_id = f.integer("checkpoint_id", 1)
        relocatable = f.flag("relocatable", default=False)
        barrier = Barrier.from_dict(doc.get("barrier"), source, "barrier")
        if barrier.checkpoint_id != checkpoint_id:
            raise f.error("barrier.checkpoint_id", f"must equal checkpoint_id {checkpoint_id}", barrier.checkpoint_id)
        restored_from = f.integer("restored_from", 1, default=None)
        return CompletedCheckpoint(
            job_id=f.string("job_id", JOB_ID),
            checkpoint_id=checkpoint_id,
            type=enum_value(CheckpointType, f, "type"),
            trigger_time=f.timestamp("trigger_time"),
            completion_time=f.timestamp("completion_time"),
            restored_from=restored_from,
            barrier=barrier,
            operators=operator_snapshots(f, "operators", HandleScope(checkpoint_id, relocatable)),
            sinks=sink_committables(f, "sinks"),
            stats=f.data("stats", default={}),
            options=checkpoint_options(f, "options"),
            relocatable=relocatable,
        )
    except DocumentError as e:
        raise MetadataError(source, f"refused ({_field_message(e)}); the checkpoint is corrupt or not ours") from None


def _field_message(e: DocumentError) -> str:
    text = str(e)
    return text[len(e.document) + 2 :] if text.startswith(e.document + ": ") else text
