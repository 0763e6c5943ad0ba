"""The completed checkpoints of a job (Flink's CompletedCheckpointStore): which there are, loading
and committing their ``_metadata``, what is retained, what goes.

A checkpoint is completed when its ``chk-<id>/_metadata`` exists: an exclusive create, so of
concurrent finalizes exactly one commits.

Retention keeps the newest ``retained`` completed checkpoints (never savepoint copies),
deletes a state file only when no retained checkpoint references it (shared files stay),
and removes the leftovers of discarded checkpoints.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from airflow_provider_checkpoint.core import metadata
from airflow_provider_checkpoint.core.documents import load_json
from airflow_provider_checkpoint.core.model import CheckpointPlan, CompletedCheckpoint
from airflow_provider_checkpoint.core.retention import deletable_paths, subsumed
from airflow_provider_checkpoint.core.status import AbortReason
from airflow_provider_checkpoint.exceptions import CheckpointStorageError, MetadataError
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.storage.job_records import JobRecordStore
from airflow_provider_checkpoint.storage.object_store import read_objects
from airflow_provider_checkpoint.storage.writes import create_exclusive

log = logging.getLogger(__name__)
_CHANNELS = re.compile(r"^[^/]+/attempt-\d+/channels(/|$)")
"""A step attempt's channels, or a file in them, relative to its checkpoint's directory."""


class CompletedCheckpointStore:
    """The completed checkpoints found in one job's storage."""

    def __init__(self, storage: JobStorage) -> None:
        self.storage = storage
        self._completed: dict[int, CompletedCheckpoint | None] = {}
        """Checkpoints found completed since :meth:`refresh`, with their loaded ``_metadata``."""
        self._listing: dict[str, Any] | None = None
        """What the ``chk-*`` directories held when listed since :meth:`refresh`, less what was deleted since."""
        self._newest_listed: int | None = None
        """The newest checkpoint whose ``_metadata`` is in the listing (0: none); unknown until asked."""

    def refresh(self) -> None:
        """Ask storage again from now on. Within one task phase (a trigger, a finalize) the lease holder is the
        only one to create or delete checkpoint directories, a checkpoint found completed stays completed and
        its ``_metadata`` unchanged (an exclusive create, deleted only by retention): the ``chk-*`` directories
        are listed once (one request on S3, whatever their number), each ``_metadata`` is read once.

        A checkpoint older than the newest listed with ``_metadata`` cannot complete any more (its
        ``_metadata`` is gone for good, or it was subsumed): what the listing shows of it is final, and
        nothing of it is asked again. Whether a newer one completed is always asked."""
        self._completed.clear()
        self._listing = None
        self._newest_listed = None

    def _listed(self) -> dict[str, Any]:
        if self._listing is None:
            self._listing = self.storage.list_checkpoints()
        return self._listing

    def _final(self, checkpoint_id: int) -> bool:
        """Whether the listing's answer for checkpoint ``checkpoint_id``'s documents is final (see :meth:`refresh`)."""
        if self._newest_listed is None:
            listed = self._listed()
            completed = [i for i in self.checkpoint_ids() if self.storage.metadata_path(i) in listed]
            self._newest_listed = max(completed, default=0)
        return checkpoint_id < self._newest_listed

    def _has(self, checkpoint_id: int, relative: str) -> bool:
        """Whether the file ``relative`` of checkpoint ``checkpoint_id`` exists: the listing's answer when final,
        else (one request) storage's."""
        if relative in self._listed():
            return True
        return not self._final(checkpoint_id) and self.storage.has_file(relative)

    def checkpoint_ids(self) -> list[int]:
        """Ids of every ``chk-*`` directory, completed or not, ascending (listed once a phase)."""
        ids = set()
        for path in self._listed():
            name = path.split("/", 1)[0]
            if JobStorage.is_chk_dir(name):
                ids.add(int(name[4:]))
        return sorted(ids)

    def listed_size(self, relative: str) -> int | None:
        """The size of file ``relative`` in a ``chk-*`` directory as listed, ``None`` if not listed."""
        info = self._listed().get(relative)
        return None if info is None or info.get("type") == "directory" else int(info["size"])

    def _forget(self, paths: Iterable[str]) -> None:
        listed = self._listed()
        for path in paths:
            listed.pop(path, None)
        self._newest_listed = None

    def _forget_dirs(self, directories: Collection[str]) -> None:
        """Forget the listed ``directories`` and everything in them."""
        inside = tuple(d + "/" for d in directories)
        self._forget([p for p in self._listed() if p in directories or p.startswith(inside)])

    def delete_dir(self, checkpoint_id: int) -> None:
        """Delete checkpoint ``checkpoint_id``'s whole directory."""
        self.delete_dirs([checkpoint_id])

    def delete_dirs(self, checkpoint_ids: Collection[int]) -> None:
        """Delete the directories of ``checkpoint_ids``, what was listed in them with one bulk request on S3."""
        if not checkpoint_ids:
            return
        final = {self.storage.chk_dir(i) for i in checkpoint_ids if self._final(i)}
        changing = {self.storage.chk_dir(i) for i in checkpoint_ids} - final
        for checkpoint_id in checkpoint_ids:
            self._completed.pop(checkpoint_id, None)
        for directory in changing:  # it may have changed since listed: list again
            self.storage.delete(directory)
        self._forget_dirs(changing)
        self._delete_listed_dirs(final)

    def is_completed(self, checkpoint_id: int) -> bool:
        if checkpoint_id in self._completed:
            return True
        found = self._has(checkpoint_id, self.storage.metadata_path(checkpoint_id))
        if found:
            self._completed[checkpoint_id] = None
        return found

    def completed_ids(self) -> list[int]:
        return [i for i in self.checkpoint_ids() if self.is_completed(i)]

    def load(self, checkpoint_id: int) -> CompletedCheckpoint:
        """Checkpoint ``checkpoint_id`` of this job, refused unless its ``_metadata`` is its own.

        Identity before any effect: the document must name this job and the id of its
        ``chk-<id>/`` directory, and be a checkpoint, not a relocatable savepoint.
        """
        found = self._metadata_of(checkpoint_id)
        if found is None:
            raise CheckpointStorageError(f"missing file {self.storage.url(self.storage.metadata_path(checkpoint_id))}")
        return found

    def _metadata_of(self, checkpoint_id: int) -> CompletedCheckpoint | None:
        """:meth:`load`, or ``None`` when checkpoint ``checkpoint_id`` has no ``_metadata`` (one request)."""
        known = self._completed.get(checkpoint_id)
        if known is not None:
            return known
        rel = self.storage.metadata_path(checkpoint_id)
        data = self.storage.read_if_present(rel) if self._may_have_metadata(checkpoint_id) else None
        return None if data is None else self._decode(checkpoint_id, data)

    def _may_have_metadata(self, checkpoint_id: int) -> bool:
        """Whether checkpoint ``checkpoint_id``'s ``_metadata`` must be asked for (it is not known to be absent)."""
        return self.storage.metadata_path(checkpoint_id) in self._listed() or not self._final(checkpoint_id)

    def _decode(self, checkpoint_id: int, data: bytes) -> CompletedCheckpoint:
        """The ``_metadata`` ``data`` of checkpoint ``checkpoint_id``, refused unless it is that checkpoint's own."""
        rel = self.storage.metadata_path(checkpoint_id)
        document = self.storage.url(rel)
        checkpoint = metadata.decode(data, document)
        if checkpoint.job_id != self.storage.job_id:
            problem = f"belongs to job {checkpoint.job_id!r}, not {self.storage.job_id!r}"
        elif checkpoint.checkpoint_id != checkpoint_id:
            problem = f"is checkpoint {checkpoint.checkpoint_id}, not {checkpoint_id} as its directory says"
        elif checkpoint.relocatable:
            problem = "is a relocatable savepoint, not a checkpoint of this job"
        else:
            self._completed[checkpoint_id] = checkpoint
            return checkpoint
        raise MetadataError(
            document,
            f"{problem}: a _metadata in a job directory must be that job's own checkpoint in its own "
            f"chk-<id>/; refused before any effect (remove {self.storage.chk_dir(checkpoint_id)}/ or restore the job)",
        )

    def latest_completed(self) -> CompletedCheckpoint | None:
        """The newest checkpoint with ``_metadata`` (newest first: directories retention keeps for their
        files, older than every retained checkpoint, are not asked)."""
        for checkpoint_id in reversed(self.checkpoint_ids()):
            checkpoint = self._metadata_of(checkpoint_id)
            if checkpoint is not None:
                return checkpoint
        return None

    def commit(self, checkpoint: CompletedCheckpoint) -> bool:
        """Create ``_metadata``, the commit point of the checkpoint; False if it already exists.

        An exclusive create: of concurrent finalizes of one checkpoint exactly one commits,
        the others get False and must continue with the committed document.
        """
        rel, data = self.storage.metadata_path(checkpoint.checkpoint_id), metadata.encode(checkpoint)
        created = create_exclusive(self.storage.fs, self.storage.path(rel), data)
        self._completed[checkpoint.checkpoint_id] = checkpoint if created else None
        if created and self._listing is not None:
            self._listing[rel] = {"type": "file", "size": len(data)}
        return created

    def latest(self) -> CompletedCheckpoint | None:
        """The latest completed checkpoint; unreadable is an error unless a restore is requested."""
        try:
            return self.latest_completed()
        except (MetadataError, CheckpointStorageError) as e:
            if JobRecordStore(self.storage).load_restore_request() is None:
                raise
            log.warning("latest checkpoint unreadable (%s); a restore is requested, continuing", e)
            return None

    def completed_plan_of(self, run_id: str) -> CheckpointPlan | None:
        """The plan of the newest checkpoint if it completed (has ``_metadata``) and run ``run_id`` planned it.

        Raises :class:`DocumentError` when that plan is unreadable.
        """
        ids = self.checkpoint_ids()
        if not ids or not self.is_completed(ids[-1]):
            return None
        path = self.storage.plan_path(ids[-1])
        if not self._has(ids[-1], path):
            return None
        plan = CheckpointPlan.from_dict(
            load_json(self.storage.read_bytes(path), self.storage.url(path)), self.storage.url(path)
        )
        return plan if plan.run_id == run_id else None

    def checkpoints(self) -> list[CompletedCheckpoint]:
        """Every readable completed checkpoint, oldest first (unreadable ones are logged and skipped): the
        ``_metadata`` not read yet in this phase are read at once (on S3 concurrently, one round trip)."""
        ids = self.checkpoint_ids()
        unread = [i for i in ids if self._completed.get(i) is None and self._may_have_metadata(i)]
        found = read_objects(self.storage.fs, [self.storage.path(self.storage.metadata_path(i)) for i in unread])
        fetched = dict(zip(unread, found.values(), strict=True))
        completed = []
        for checkpoint_id in ids:
            try:
                if checkpoint_id in fetched:
                    data = fetched[checkpoint_id]
                    checkpoint = None if data is None else self._decode(checkpoint_id, data)
                else:
                    checkpoint = self._metadata_of(checkpoint_id)
            except (MetadataError, CheckpointStorageError) as e:
                log.warning("skipping unreadable checkpoint %d: %s", checkpoint_id, e)
                continue
            if checkpoint is not None:
                completed.append(checkpoint)
        return completed

    def abandoned_attempts(self) -> list[tuple[int, AbortReason, str]]:
        """Every ``chk-*`` with a plan and without ``_metadata`` whose files no completed checkpoint needs,
        with why it is aborted: older than the latest completed checkpoint ``SUBSUMED`` (not counted), newer
        ``ABANDONED``. Call it holding the lease, so no checkpoint is in flight.

        A newer directory without a plan is a leftover (of a trigger that died), deleted here. An older
        one without a plan is kept for the shared files of a newer checkpoint, or is retention's to delete;
        the completed checkpoints' ``_metadata`` are read only when an older directory has a plan.
        """
        ids = self.checkpoint_ids()
        newest = max((i for i in ids if self.is_completed(i)), default=0)
        undecided = [i for i in ids if not self.is_completed(i)]
        older_planned = [i for i in undecided if i < newest and self._has(i, self.storage.plan_path(i))]
        needed = set().union(*(c.referenced_paths() for c in self.checkpoints())) if older_planned else set()
        abandoned = []
        for checkpoint_id in undecided:
            chk = self.storage.chk_dir(checkpoint_id)
            if checkpoint_id < newest:
                if checkpoint_id in older_planned and not any(p.startswith(chk + "/") for p in needed):
                    abandoned.append(
                        (checkpoint_id, AbortReason.SUBSUMED, f"subsumed by completed checkpoint {newest}")
                    )
            elif not self._has(checkpoint_id, self.storage.plan_path(checkpoint_id)):
                self.delete_dir(checkpoint_id)
            else:
                abandoned.append(
                    (checkpoint_id, AbortReason.ABANDONED, "abandoned: its run died before finalize decided")
                )
        return abandoned

    def discard_attempts_except(self, checkpoint_id: int, steps: Sequence[str], keep: set[str]) -> None:
        """Delete every attempt directory of ``steps`` in checkpoint ``checkpoint_id`` but those in ``keep``
        (as listed: call it once the steps are done)."""
        chk = self.storage.chk_dir(checkpoint_id)
        found = set()
        for path in self._listed():
            parts = path.split("/")
            if len(parts) > 2 and parts[0] == chk and parts[1] in steps:
                found.add("/".join(parts[:3]))
        self._delete_listed_dirs(found - keep)

    def discard_channels(self, checkpoint_id: int) -> None:
        """Channels are exchanged within one checkpoint: once it completes, nobody reads them again."""
        chk = self.storage.chk_dir(checkpoint_id)
        found = set()
        for path in self._listed():
            match = _CHANNELS.match(path[len(chk) + 1 :]) if path.startswith(chk + "/") else None
            if match:
                found.add(path[: len(chk) + 1 + match.end()].rstrip("/"))
        self._delete_listed_dirs(found)

    def _delete_listed_dirs(self, directories: set[str]) -> None:
        self.storage.delete_listed_dirs(directories, self._listed())
        self._forget_dirs(directories)

    def retain(self, retained: int) -> None:
        """Discard all but the ``retained`` newest completed checkpoints."""
        completed = self.checkpoints()
        discard = subsumed(completed, retained)
        if not discard:
            return
        kept = [c for c in completed if c not in discard]
        for checkpoint in discard:
            self._completed.pop(checkpoint.checkpoint_id, None)
        deletable = deletable_paths(discard, kept)
        self.storage.delete_files(deletable)
        self._forget(deletable)
        still_needed = set().union(*(c.referenced_paths() for c in kept))
        kept_ids = {c.checkpoint_id for c in kept}
        discarded_ids = {c.checkpoint_id for c in discard}
        doomed = []
        for checkpoint_id in self.checkpoint_ids():
            chk = self.storage.chk_dir(checkpoint_id)
            if checkpoint_id in kept_ids or checkpoint_id > max(kept_ids):
                continue
            if any(p.startswith(chk + "/") for p in still_needed):
                # a kept checkpoint still reads files here: keep only those (documents went when it was discarded)
                if checkpoint_id in discarded_ids:
                    documents = [self.storage.metadata_path(checkpoint_id), self.storage.plan_path(checkpoint_id)]
                    self.storage.delete_files(documents)
                    self._forget(documents)
            elif self.is_completed(checkpoint_id) or not self._has(
                checkpoint_id, self.storage.plan_path(checkpoint_id)
            ):
                doomed.append(checkpoint_id)
        self.delete_dirs(doomed)
