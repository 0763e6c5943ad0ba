"""The versioned ``_metadata`` codec: JSON, never pickle; unknown versions are refused."""

from __future__ import annotations

import json

from airflow_provider_checkpoint.core.model import (
    Barrier,
    CheckpointType,
    CompletedCheckpoint,
    OperatorSnapshot,
)

FORMAT = "airflow-checkpoint"
VERSION = 1


class MetadataError(ValueError):
    """``_metadata`` cannot be read: not ours, corrupt, or written by a newer version."""


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
    """Parse ``_metadata``; ``source`` names the file in every error."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MetadataError(f"{source}: not valid JSON ({e}); the checkpoint is corrupt") from e
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise MetadataError(f"{source}: not an {FORMAT} metadata file")
    version = doc.get("version")
    if version != VERSION:
        raise MetadataError(
            f"{source}: metadata version {version!r} is not supported by this provider "
            f"(it reads version {VERSION}); upgrade airflow-provider-checkpoint to restore it"
        )
    try:
        return CompletedCheckpoint(
            job_id=str(doc["job_id"]),
            checkpoint_id=int(doc["checkpoint_id"]),
            type=CheckpointType(doc["type"]),
            trigger_time=float(doc["trigger_time"]),
            completion_time=float(doc["completion_time"]),
            restored_from=doc.get("restored_from"),
            barrier=Barrier.from_dict(doc["barrier"]),
            operators={u: OperatorSnapshot.from_dict(s) for u, s in doc["operators"].items()},
            sinks={u: list(c) for u, c in doc["sinks"].items()},
            stats=dict(doc.get("stats", {})),
            options=dict(doc.get("options", {})),
            relocatable=bool(doc.get("relocatable", False)),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise MetadataError(f"{source}: malformed metadata ({e!r}); the checkpoint is corrupt") from e
