"""The storage of one job: ``<storage_root>/<job_id>/`` on any fsspec filesystem.

Layout::

    _job.json               job record (id counter, status, failures)
    _lease                  exclusive in-flight marker (run id, expiry)
    chk-<id>/<step>/attempt-<n>/   files of one step attempt
    chk-<id>/_metadata      the commit point of checkpoint <id>
    _stats/<id>.json        stats of every attempted checkpoint

Writes that others rely on are atomic (:mod:`.writes`): a temporary name renamed into
place on local filesystems, a single PUT on object stores. The lease and ``_metadata``
are exclusive creates, so two triggers can never both hold the lease and two finalizes
never both commit a checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import math
import posixpath
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec import AbstractFileSystem

from airflow_provider_checkpoint.core import metadata
from airflow_provider_checkpoint.core.documents import load_json
from airflow_provider_checkpoint.core.job_record import JobRecord
from airflow_provider_checkpoint.core.model import CompletedCheckpoint, JsonDict, RestoreRequest
from airflow_provider_checkpoint.exceptions import (
    CheckpointStorageError,
    DocumentError,
    JobRecordError,
    LeaseHeld,
    MetadataError,
    shorten,
)
from airflow_provider_checkpoint.state.handles import OperatorSnapshot, StateHandle
from airflow_provider_checkpoint.storage.object_store import (
    check_reachable,
    delete_objects,
    file_exists,
    is_s3,
    with_defaults,
)
from airflow_provider_checkpoint.storage.paths import is_local, owned_path
from airflow_provider_checkpoint.storage.writes import create_exclusive, write_atomic

METADATA = "_metadata"
RESTORE_REQUEST = "_restore.json"
JOB_FILE = "_job.json"
PLAN_FILE = "_plan.json"
LEASE_FILE = "_lease"
STATS_DIR = "_stats"
_CHK = re.compile(r"^chk-(\d+)$")


def file_checksum(fs: AbstractFileSystem, path: str) -> str:
    digest = hashlib.sha256()
    with fs.open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def inline_parquet(state: OperatorSnapshot, uid: str) -> bytes:
    """The Parquet bytes of ``state``'s inline state; :class:`CheckpointStorageError` if altered."""
    data = state.inline.parquet() if state.inline is not None else None
    if data is None:
        raise CheckpointStorageError(f"inline state of operator {uid} is missing or corrupt: size or checksum mismatch")
    return data


@dataclass(frozen=True)
class Location:
    """A directory on an fsspec filesystem; paths given to it are relative to ``base``."""

    fs: AbstractFileSystem
    base: str

    @classmethod
    def from_url(cls, url: str, **storage_options: Any) -> Location:
        options = with_defaults(fsspec.core.split_protocol(url)[0] or "file", storage_options)
        try:
            fs, path = fsspec.core.url_to_fs(url, **options)
        except (ValueError, ImportError) as e:  # unknown scheme, or its filesystem package is missing
            raise CheckpointStorageError(f"no filesystem serves {shorten(url)}: {e}") from e
        if is_local(fs):
            path = posixpath.abspath(path)
        return cls(fs, path.rstrip("/"))

    def path(self, relative: str) -> str:
        """``base/relative``; a path that would leave ``base`` (``..``, absolute, a symlink out) is refused."""
        return owned_path(self.fs, self.base, relative) if relative else self.base

    def beside(self, url: str) -> Location:
        """``url`` on this filesystem when it names the same (not local) scheme, else opened afresh: a savepoint
        or restore point beside a job's storage takes the storage's credentials and endpoint (its connection)."""
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        if is_local(self.fs) or fsspec.core.split_protocol(url)[0] not in protocols:
            return Location.from_url(url)
        return Location(self.fs, self.fs._strip_protocol(url).rstrip("/"))

    def url(self, relative: str = "") -> str:
        """A URL Spark and other engines can open (``file:///…`` for local storage)."""
        protocol = "file" if is_local(self.fs) else self.fs.protocol
        if isinstance(protocol, tuple):
            protocol = protocol[0]
        return f"{protocol}://{self.path(relative)}"

    def relative(self, url_or_path: str) -> str:
        """The relative form of a path inside this directory."""
        path = self.fs._strip_protocol(url_or_path)
        prefix = self.base + "/"
        if not path.startswith(prefix):
            raise CheckpointStorageError(f"{url_or_path} is not inside {self.base}")
        return path[len(prefix) :]

    def exists(self, relative: str) -> bool:
        """Whether the file or directory ``relative`` exists."""
        return bool(self.fs.exists(self.path(relative)))

    def has_file(self, relative: str) -> bool:
        """Whether the file ``relative`` exists (one request on an object store)."""
        return file_exists(self.fs, self.path(relative))

    def read_bytes(self, relative: str) -> bytes:
        try:
            return bytes(self.fs.cat_file(self.path(relative)))
        except FileNotFoundError as e:
            raise CheckpointStorageError(f"missing file {self.url(relative)}") from e

    def write_atomic(self, relative: str, data: bytes) -> None:
        write_atomic(self.fs, self.path(relative), data)

    def delete(self, relative: str) -> None:
        """Delete the file or directory ``relative`` if it exists."""
        path = self.path(relative)
        if is_s3(self.fs):
            delete_objects(self.fs, path, self.base)
        elif self.fs.exists(path):
            self.fs.rm(path, recursive=True)

    def delete_paths(self, relatives: Iterable[str]) -> None:
        for rel in sorted(relatives):
            self.delete(rel)

    def handle_for(self, relative: str, key_groups: tuple[int, int] | None = None) -> StateHandle:
        full = self.path(relative)
        return StateHandle(relative, int(self.fs.size(full)), file_checksum(self.fs, full), key_groups)

    def verify(self, handle: StateHandle, deep: bool = True) -> None:
        """Raise :class:`CheckpointStorageError` naming the file if it is missing or altered
        (its size; with ``deep`` also its SHA-256)."""
        full = self.path(handle.path)
        try:
            info = self.fs.info(full)  # one request on an object store
        except FileNotFoundError:
            info = None
        if info is None or info.get("type") != "file":
            raise CheckpointStorageError(f"state file missing: {self.url(handle.path)}")
        size = int(info["size"])
        if size != handle.size:
            raise CheckpointStorageError(
                f"state file corrupt: {self.url(handle.path)} has {size} bytes, expected {handle.size}"
            )
        if deep and file_checksum(self.fs, full) != handle.checksum:
            raise CheckpointStorageError(f"state file corrupt: checksum mismatch for {self.url(handle.path)}")

    def load_snapshot(self) -> CompletedCheckpoint:
        """The checkpoint or savepoint whose ``_metadata`` lies in this directory."""
        return metadata.decode(self.read_bytes(METADATA), self.url(METADATA))


class JobStorage(Location):
    """Paths and atomic operations under one job directory ``<root>/<job_id>``."""

    def __init__(self, fs: AbstractFileSystem, root: str, job_id: str) -> None:
        super().__init__(fs, f"{root.rstrip('/')}/{job_id}")
        object.__setattr__(self, "root", root.rstrip("/"))
        object.__setattr__(self, "job_id", job_id)

    root: str
    job_id: str

    @classmethod
    def for_job(cls, storage_root: str, job_id: str, **storage_options: Any) -> JobStorage:
        """The job ``job_id`` under ``storage_root``; an object store is probed first (:func:`check_reachable`).

        ``storage_options``: the filesystem's; on S3 ``conn_id`` names an Airflow ``aws`` connection."""
        location = Location.from_url(storage_root, **storage_options)
        check_reachable(location.fs, location.base, storage_root, storage_options.get("conn_id"))
        return cls(location.fs, location.base, job_id)

    @property
    def job_dir(self) -> str:
        return self.base

    def checkpoint_location(self, checkpoint_id: int) -> Location:
        return Location(self.fs, self.path(self.chk_dir(checkpoint_id)))

    # -- layout ------------------------------------------------------------------------
    @staticmethod
    def plan_path(checkpoint_id: int) -> str:
        """The plan of checkpoint ``checkpoint_id``, written when it is triggered."""
        return f"{JobStorage.chk_dir(checkpoint_id)}/{PLAN_FILE}"

    @staticmethod
    def stats_path(checkpoint_id: int) -> str:
        """The statistics of checkpoint ``checkpoint_id`` (written for every attempt, never pruned)."""
        return f"{STATS_DIR}/{checkpoint_id}.json"

    @staticmethod
    def chk_dir(checkpoint_id: int) -> str:
        return f"chk-{checkpoint_id}"

    @staticmethod
    def is_chk_dir(name: str) -> bool:
        """Whether ``name`` (a path segment) is a checkpoint directory ``chk-<id>``."""
        return _CHK.match(name) is not None

    @classmethod
    def metadata_path(cls, checkpoint_id: int) -> str:
        return f"{cls.chk_dir(checkpoint_id)}/{METADATA}"

    @classmethod
    def attempt_dir(cls, checkpoint_id: int, step: str, attempt: int) -> str:
        return f"{cls.chk_dir(checkpoint_id)}/{step}/attempt-{attempt}"

    # -- job record --------------------------------------------------------------------
    def load_job(self) -> JobRecord:
        if not self.has_file(JOB_FILE):
            return JobRecord(job_id=self.job_id)
        record = JobRecord.decode(self.read_bytes(JOB_FILE), self.url(JOB_FILE))
        if record.job_id != self.job_id:
            raise JobRecordError(f"{self.url('_job.json')}: belongs to job {record.job_id!r}, not {self.job_id!r}")
        return record

    def save_job(self, record: JobRecord) -> None:
        self.write_atomic(JOB_FILE, record.encode())

    # -- restore request ---------------------------------------------------------------
    def load_restore_request(self) -> RestoreRequest | None:
        if not self.has_file(RESTORE_REQUEST):
            return None
        document = self.url(RESTORE_REQUEST)
        try:
            return RestoreRequest.from_dict(load_json(self.read_bytes(RESTORE_REQUEST), document), document)
        except DocumentError as e:
            raise CheckpointStorageError(f"restore request refused: {e}; run the restore DAG again") from e

    def write_restore_request(self, request: RestoreRequest) -> None:
        self.write_atomic(RESTORE_REQUEST, json.dumps(request.to_dict(), indent=1, sort_keys=True).encode())

    def clear_restore_request(self, request_id: str) -> None:
        """Remove the pending restore request if it is still ``request_id``."""
        current = self.load_restore_request()
        if current is not None and current.request_id == request_id:
            self.delete(RESTORE_REQUEST)

    # -- lease -------------------------------------------------------------------------
    def acquire_lease(
        self,
        run_id: str,
        ttl_seconds: float,
        now: float | None = None,
        owner: JsonDict | None = None,
        holder_alive: Callable[[JsonDict], bool] | None = None,
    ) -> None:
        """Hold the job's in-flight lease for ``run_id``; re-entrant for the same run.

        The lease of another run is broken when it has expired, or when ``holder_alive``
        says that run is over (its checkpoint is then abandoned and cleaned up).
        """
        now = time.time() if now is None else now
        body = json.dumps(
            {**(owner or {}), "run_id": run_id, "acquired_at": now, "expires_at": now + ttl_seconds}
        ).encode()
        for _ in range(3):
            if create_exclusive(self.fs, self.path(LEASE_FILE), body):
                return
            holder = self.lease_holder()
            if holder is None:
                continue
            if holder.get("run_id") == run_id:
                self.write_atomic(LEASE_FILE, body)
                return
            expired = float(holder.get("expires_at", math.inf)) <= now
            if not expired and (holder_alive is None or holder_alive(holder)):
                raise LeaseHeld(holder)
            self._break_lease(holder)
        raise LeaseHeld(self.lease_holder() or {})

    def _break_lease(self, holder: JsonDict) -> None:
        """Delete the lease only if it is still ``holder``'s (another trigger may have broken it)."""
        if self.lease_holder() == holder:
            self.delete(LEASE_FILE)

    def lease_holder(self) -> JsonDict | None:
        try:
            holder = load_json(self.fs.cat_file(self.path(LEASE_FILE)), self.url(LEASE_FILE))
        except FileNotFoundError:
            return None
        except DocumentError:
            holder = None
        expires = holder.get("expires_at", math.inf) if isinstance(holder, dict) else None
        if not isinstance(holder, dict) or isinstance(expires, bool) or not isinstance(expires, int | float):
            # never break what we cannot read: it may be another trigger's lease
            return {"run_id": f"<unreadable lease; delete {self.url('_lease')} if no checkpoint runs>"}
        return holder

    def release_lease(self, run_id: str) -> None:
        holder = self.lease_holder()
        if holder is not None and holder.get("run_id") == run_id:
            self.delete(LEASE_FILE)

    # -- checkpoints -------------------------------------------------------------------
    def checkpoint_ids(self) -> list[int]:
        """Ids of every ``chk-*`` directory, completed or not, ascending."""
        try:
            entries = self.fs.ls(self.job_dir, detail=False)
        except FileNotFoundError:
            return []
        ids = []
        for entry in entries:
            m = _CHK.match(posixpath.basename(entry.rstrip("/")))
            if m:
                ids.append(int(m.group(1)))
        return sorted(ids)

    def is_completed(self, checkpoint_id: int) -> bool:
        return self.has_file(self.metadata_path(checkpoint_id))

    def completed_ids(self) -> list[int]:
        return [i for i in self.checkpoint_ids() if self.is_completed(i)]

    def load_completed(self, checkpoint_id: int) -> CompletedCheckpoint:
        """Checkpoint ``checkpoint_id`` of this job, refused unless its ``_metadata`` is its own.

        Identity before any effect: the document must name this job and the id of its
        ``chk-<id>/`` directory, and be a checkpoint, not a relocatable savepoint.
        """
        rel = self.metadata_path(checkpoint_id)
        document = self.url(rel)
        checkpoint = metadata.decode(self.read_bytes(rel), document)
        if checkpoint.job_id != self.job_id:
            problem = f"belongs to job {checkpoint.job_id!r}, not {self.job_id!r}"
        elif checkpoint.checkpoint_id != checkpoint_id:
            problem = f"is checkpoint {checkpoint.checkpoint_id}, not {checkpoint_id} as its directory says"
        elif checkpoint.relocatable:
            problem = "is a relocatable savepoint, not a checkpoint of this job"
        else:
            return checkpoint
        raise MetadataError(
            document,
            f"{problem}: a _metadata in a job directory must be that job's own checkpoint in its own "
            f"chk-<id>/; refused before any effect (remove {self.chk_dir(checkpoint_id)}/ or restore the job)",
        )

    def latest_completed(self) -> CompletedCheckpoint | None:
        """The newest checkpoint with ``_metadata`` (newest first: directories retention keeps for their
        files, older than every retained checkpoint, are not asked)."""
        latest = next((i for i in reversed(self.checkpoint_ids()) if self.is_completed(i)), None)
        return None if latest is None else self.load_completed(latest)

    def commit_metadata(self, checkpoint: CompletedCheckpoint) -> bool:
        """Create ``_metadata``, the commit point of the checkpoint; False if it already exists.

        An exclusive create: of concurrent finalizes of one checkpoint exactly one commits,
        the others get False and must continue with the committed document.
        """
        return create_exclusive(
            self.fs, self.path(self.metadata_path(checkpoint.checkpoint_id)), metadata.encode(checkpoint)
        )

    def write_stats(self, checkpoint_id: int, stats: JsonDict) -> None:
        self.write_atomic(self.stats_path(checkpoint_id), json.dumps(stats, indent=1, sort_keys=True).encode())

    def load_stats(self, checkpoint_id: int) -> JsonDict | None:
        """The stats of ``checkpoint_id``; ``None`` when missing or not a JSON object of that id.

        Stats are informational: an unreadable file is skipped, never trusted.
        """
        name = self.stats_path(checkpoint_id)
        try:
            stats = load_json(self.fs.cat_file(self.path(name)), self.url(name))
        except (FileNotFoundError, DocumentError):
            return None
        return stats if isinstance(stats, dict) and stats.get("checkpoint_id") == checkpoint_id else None

    def read_stats(self) -> list[JsonDict]:
        folder = self.path("_stats")
        if not self.fs.exists(folder):
            return []
        out = []
        for path in self.fs.ls(folder, detail=False):
            if not path.endswith(".json"):
                continue
            try:
                stats = load_json(self.fs.cat_file(path), path)
            except DocumentError:
                continue  # stats are informational: an unreadable file is skipped, never trusted
            checkpoint_id = stats.get("checkpoint_id") if isinstance(stats, dict) else None
            if isinstance(checkpoint_id, int) and not isinstance(checkpoint_id, bool):
                out.append(stats)
        return sorted(out, key=lambda s: int(s["checkpoint_id"]))
