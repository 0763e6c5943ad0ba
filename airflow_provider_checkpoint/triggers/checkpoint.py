"""Triggers of the checkpoint sensors.

Each polls a condition of :class:`~airflow_provider_checkpoint.hooks.checkpoint.CheckpointStorageHook`
(synchronous) through :func:`asyncio.to_thread`, so a slow filesystem never blocks the
triggerer's event loop.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_checkpoint.core.model import JsonDict
from airflow_provider_checkpoint.dataflow.graph import Source
from airflow_provider_checkpoint.exceptions import CheckpointError
from airflow_provider_checkpoint.hooks.checkpoint import CheckpointStorageHook

_MODULE = __name__


# -- source specs: how a trigger gets the pipeline's sources ----------------------------
_CONNECTORS = "airflow_provider_checkpoint.connectors."


def source_spec(source: Source) -> JsonDict:
    """A JSON description of ``source`` (its class and :meth:`~.Source.to_spec`) that
    :func:`source_from_spec` rebuilds it from."""
    kind = type(source)
    return {"class": f"{kind.__module__}.{kind.__qualname__}", "args": source.to_spec()}


def source_from_spec(spec: JsonDict) -> Source:
    """The source ``spec`` describes: a :class:`~.Source` of this package's connectors, nothing else."""
    path, args = spec.get("class"), spec.get("args")
    module, _, name = path.rpartition(".") if isinstance(path, str) else ("", "", "")
    kind = getattr(importlib.import_module(module), name, None) if module.startswith(_CONNECTORS) else None
    if not (isinstance(kind, type) and issubclass(kind, Source) and isinstance(args, dict)):
        raise CheckpointError(f"a deferred sensor's source spec names no source of this package: {path!r}")
    return kind.from_spec(args)


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

    def _check(self, hook: CheckpointStorageHook) -> JsonDict | None:
        raise NotImplementedError

    def _poll(self) -> JsonDict | None:
        return self._check(CheckpointStorageHook(self.job_id, self.storage_root, self.storage_conn_id))

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

    def _check(self, hook: CheckpointStorageHook) -> JsonDict | None:
        found = hook.new_input([source_from_spec(s) for s in self.sources])
        return {"sources": found} if found else None


class CheckpointCompletedTrigger(_StorageTrigger):
    """Fires once the job has committed a checkpoint (or savepoint) newer than ``after_checkpoint_id``.

    The event carries what :meth:`CheckpointStorageHook.committed_after` returns (``"checkpoint_id"``, ...).

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

    def _check(self, hook: CheckpointStorageHook) -> JsonDict | None:
        return hook.committed_after(self.after_checkpoint_id, self.savepoint)
