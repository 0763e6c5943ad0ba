"""The stats records of a job's checkpoints (``_stats/<id>.json``): one per attempted checkpoint,
completed or aborted, never pruned. Informational: an unreadable record is skipped, never trusted.
What a record holds is built by :mod:`airflow_provider_checkpoint.core.stats`."""

from __future__ import annotations

import json

from airflow_provider_checkpoint.core.documents import load_json
from airflow_provider_checkpoint.core.model import JsonDict
from airflow_provider_checkpoint.exceptions import DocumentError
from airflow_provider_checkpoint.storage.job_storage import JobStorage


class StatsStore:
    """Writes and reads the stats records of ``storage``'s job."""

    def __init__(self, storage: JobStorage) -> None:
        self.storage = storage

    def write(self, checkpoint_id: int, stats: JsonDict) -> None:
        self.storage.write_atomic(
            self.storage.stats_path(checkpoint_id), json.dumps(stats, indent=1, sort_keys=True).encode()
        )

    def load(self, checkpoint_id: int) -> JsonDict | None:
        """The stats of ``checkpoint_id``; ``None`` when missing or not a JSON object of that id.

        Stats are informational: an unreadable file is skipped, never trusted.
        """
        name = self.storage.stats_path(checkpoint_id)
        data = self.storage.read_if_present(name)
        try:
            stats = None if data is None else load_json(data, self.storage.url(name))
        except DocumentError:
            return None
        return stats if isinstance(stats, dict) and stats.get("checkpoint_id") == checkpoint_id else None

    def read_all(self) -> list[JsonDict]:
        folder = self.storage.path("_stats")
        if not self.storage.fs.exists(folder):
            return []
        out = []
        for path in self.storage.fs.ls(folder, detail=False):
            if not path.endswith(".json"):
                continue
            try:
                stats = load_json(self.storage.fs.cat_file(path), path)
            except DocumentError:
                continue  # stats are informational: an unreadable file is skipped, never trusted
            checkpoint_id = stats.get("checkpoint_id") if isinstance(stats, dict) else None
            if isinstance(checkpoint_id, int) and not isinstance(checkpoint_id, bool):
                out.append(stats)
        return sorted(out, key=lambda s: int(s["checkpoint_id"]))
