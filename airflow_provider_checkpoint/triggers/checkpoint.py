"""Triggers of the checkpoint sensors, and the conditions they (and the sensors) check.

The conditions are plain synchronous functions over the job's storage and the
pipeline's sources. The triggers run them with :func:`asyncio.to_thread`, so a slow
filesystem never blocks the triggerer's event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_checkpoint.core.model import JsonDict
from airflow_provider_checkpoint.dataflow.graph import Source
from airflow_provider_checkpoint.dataflow.sources import FileSource
from airflow_provider_checkpoint.exceptions import CheckpointError
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.storage.config import job_storage

_MODULE = __name__


# -- conditions (synchronous) ------------------------------------------------------------
def new_input(storage: JobStorage, sources: Sequence[Source]) -> list[str]:
    """Uids of the sources holding input beyond the latest completed checkpoint's positions.

    A pending restore request counts as input for every source: the next checkpoint
    restores, whatever the sources hold.
    """
    if storage.load_restore_request() is not None:
        return [s.uid for s in sources]
    latest = storage.latest_completed()
    positions = latest.source_positions if latest else {}
    found = []
    for source in sources:
        previous = positions.get(source.uid) or source.initial_position()
        if source.barrier_position(previous) != previous:
            found.append(source.uid)
    return found


def committed_after(storage: JobStorage, after_checkpoint_id: int, savepoint: bool = False) -> JsonDict | None:
    """The newest checkpoint (or savepoint) of the job newer than ``after_checkpoint_id``
    whose sinks are committed, as ``{"checkpoint_id", "end_time"[, "savepoint"]}``; else ``None``.

    A checkpoint counts once its statistics say ``COMPLETED``: these are written after
    the sink commit, so a reader sees the checkpoint's output in the tables.
    """
    if savepoint:
        newer = [sp for sp in storage.load_job().savepoints if int(sp["checkpoint_id"]) > after_checkpoint_id]
        if not newer:
            return None
        latest = max(newer, key=lambda sp: int(sp["checkpoint_id"]))
        return {"checkpoint_id": int(latest["checkpoint_id"]), "savepoint": str(latest["path"])}
    for checkpoint_id in reversed(storage.completed_ids()):
        if checkpoint_id <= after_checkpoint_id:
            return None
        record = storage.load_stats(checkpoint_id)
        if record is not None and record.get("status") == "COMPLETED":
            end_time = record.get("end_time")
            return {"checkpoint_id": checkpoint_id, "end_time": end_time if isinstance(end_time, int | float) else None}
    return None


def latest_committed_id(storage: JobStorage) -> int:
    """Id of the newest completed checkpoint of the job (0 when there is none)."""
    ids = storage.completed_ids()
    return ids[-1] if ids else 0


# -- source specs: how a trigger gets the pipeline's sources ----------------------------
def source_spec(source: Source) -> JsonDict:
    """A JSON description of ``source`` from which :func:`source_from_spec` rebuilds it."""
    if not isinstance(source, FileSource):
        raise TypeError(f"source {source.uid}: {type(source).__name__} cannot be watched by a deferred sensor")
    return {
        "uid": source.uid,
        "path": source.path,
        "format": source.format,
        "schema": source.schema,
        "pattern": source.pattern,
        "options": source.options,
        "storage_options": source.storage_options,
    }


def source_from_spec(spec: JsonDict) -> Source:
    return FileSource(**spec)


# -- triggers ----------------------------------------------------------------------------
class _StorageTrigger(BaseTrigger):
    """Polls one job's storage every ``poke_interval`` seconds until ``_check`` finds something.

    Yields one event: ``{"status": "success", ...found}``; ``{"status": "refused", "message"}``
    on refused input or unreadable storage (the sensor fails without retry); ``{"status":
    "error", "message"}`` on any other error.

    :param job_id: The job whose storage it polls.
    :param storage_root: URL of the checkpoint storage root holding the job.
    :param storage_conn_id: Airflow connection for the storage root's filesystem.
    :param poke_interval: Seconds between two checks.
    """

    def __init__(self, job_id: str, storage_root: str, storage_conn_id: str | None, poke_interval: float) -> None:
        super().__init__()
        self.job_id = job_id
        self.storage_root = storage_root
        self.storage_conn_id = storage_conn_id
        self.poke_interval = poke_interval

    def _common(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "storage_root": self.storage_root,
            "storage_conn_id": self.storage_conn_id,
            "poke_interval": self.poke_interval,
        }

    def _check(self, storage: JobStorage) -> JsonDict | None:
        raise NotImplementedError

    def _poll(self) -> JsonDict | None:
        return self._check(job_storage(self.job_id, self.storage_root, self.storage_conn_id))

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                found = await asyncio.to_thread(self._poll)
            except CheckpointError as e:  # refused input: the sensor fails without retry
                yield TriggerEvent({"status": "refused", "message": f"job {self.job_id}: {e}"})
                return
            except Exception as e:  # the sensor decides; the message names the job and the error
                yield TriggerEvent({"status": "error", "message": f"job {self.job_id}: {e!r}"})
                return
            if found is not None:
                yield TriggerEvent({"status": "success", **found})
                return
            await asyncio.sleep(self.poke_interval)


class CheckpointInputTrigger(_StorageTrigger):
    """Fires once a pipeline's sources hold input beyond the latest completed checkpoint.

    The event carries ``"sources"``: the uids of the sources with new input.

    :param job_id: The job whose storage it polls.
    :param storage_root: URL of the checkpoint storage root holding the job.
    :param sources: The pipeline's sources, as :func:`source_spec` describes them.
    :param storage_conn_id: Airflow connection for the storage root's filesystem.
    :param poke_interval: Seconds between two checks.
    """

    def __init__(
        self,
        job_id: str,
        storage_root: str,
        sources: list[JsonDict],
        storage_conn_id: str | None = None,
        poke_interval: float = 30.0,
    ) -> None:
        super().__init__(job_id, storage_root, storage_conn_id, poke_interval)
        self.sources = sources

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{_MODULE}.CheckpointInputTrigger", {**self._common(), "sources": self.sources}

    def _check(self, storage: JobStorage) -> JsonDict | None:
        found = new_input(storage, [source_from_spec(s) for s in self.sources])
        return {"sources": found} if found else None


class CheckpointCompletedTrigger(_StorageTrigger):
    """Fires once the job has committed a checkpoint (or savepoint) newer than ``after_checkpoint_id``.

    The event carries what :func:`committed_after` returns (``"checkpoint_id"``, ...).

    :param job_id: The job whose storage it polls.
    :param storage_root: URL of the checkpoint storage root holding the job.
    :param after_checkpoint_id: Fire for a checkpoint newer than this id.
    :param savepoint: Fire for a savepoint instead of a checkpoint.
    :param storage_conn_id: Airflow connection for the storage root's filesystem.
    :param poke_interval: Seconds between two checks.
    """

    def __init__(
        self,
        job_id: str,
        storage_root: str,
        after_checkpoint_id: int,
        savepoint: bool = False,
        storage_conn_id: str | None = None,
        poke_interval: float = 30.0,
    ) -> None:
        super().__init__(job_id, storage_root, storage_conn_id, poke_interval)
        self.after_checkpoint_id = after_checkpoint_id
        self.savepoint = savepoint

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{_MODULE}.CheckpointCompletedTrigger", {
            **self._common(),
            "after_checkpoint_id": self.after_checkpoint_id,
            "savepoint": self.savepoint,
        }

    def _check(self, storage: JobStorage) -> JsonDict | None:
        return committed_after(storage, self.after_checkpoint_id, self.savepoint)
