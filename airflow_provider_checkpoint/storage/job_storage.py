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

import os
import posixpath
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec import AbstractFileSystem

from airflow_provider_checkpoint.core import metadata
from airflow_provider_checkpoint.core.checksums import checksum_of
from airflow_provider_checkpoint.core.faults import fault_point
from airflow_provider_checkpoint.core.model import CompletedCheckpoint
from airflow_provider_checkpoint.exceptions import (
    CheckpointStorageError,
    UnsafePathError,
    shorten,
)
from airflow_provider_checkpoint.state.handles import OperatorSnapshot, StateHandle
from airflow_provider_checkpoint.storage.object_store import (
    check_reachable,
    delete_listed,
    delete_objects,
    file_exists,
    find_prefixed,
    is_s3,
    read_object,
    share_loader,
    with_defaults,
)
from airflow_provider_checkpoint.storage.paths import is_local, owned_path
from airflow_provider_checkpoint.storage.writes import write_atomic

METADATA = "_metadata"
RESTORE_REQUEST = "_restore.json"
JOB_FILE = "_job.json"
PLAN_FILE = "_plan.json"
LEASE_FILE = "_lease"
STATS_DIR = "_stats"
SOURCES_DIR = "_sources"
"""Files a source keeps of its own, under ``_sources/<uid>/`` (a CDC source's initial snapshot and slot marker)."""
_CHK = re.compile(r"^chk-(\d+)$")


def file_checksum(fs: AbstractFileSystem, path: str) -> str:
    """The handle checksum (:func:`.checksums.checksum_of`) of the file ``path``, read in chunks of 1 MiB."""
    with fs.open(path, "rb") as f:
        return checksum_of(iter(lambda: f.read(1 << 20), b""))


def inline_parquet(state: OperatorSnapshot, uid: str) -> bytes:
    """The Parquet bytes of ``state``'s inline state; :class:`CheckpointStorageError` if altered."""
    data = state.inline.parquet() if state.inline is not None else None
    if data is None:
        raise CheckpointStorageError(f"inline state of operator {uid} is missing or corrupt: size or checksum mismatch")
    return data


def _ancestors(path: str, base: str) -> list[str]:
    """The directories of ``path`` below ``base``."""
    out = []
    parent = posixpath.dirname(path)
    while parent.startswith(base.rstrip("/") + "/"):
        out.append(parent)
        parent = posixpath.dirname(parent)
    return out


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
        return cls(share_loader(fs), path.rstrip("/"))

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
            return read_object(self.fs, self.path(relative))
        except FileNotFoundError as e:
            raise CheckpointStorageError(f"missing file {self.url(relative)}") from e

    def read_if_present(self, relative: str) -> bytes | None:
        """The file ``relative``, or ``None`` when it does not exist (one request on an object store)."""
        try:
            return read_object(self.fs, self.path(relative))
        except FileNotFoundError:
            return None

    def write_atomic(self, relative: str, data: bytes) -> None:
        write_atomic(self.fs, self.path(relative), data)

    def delete(self, relative: str) -> None:
        """Delete the file or directory ``relative`` if it exists."""
        path = self.path(relative)
        if is_s3(self.fs):
            delete_objects(self.fs, path, self.base)
        elif self.fs.exists(path):
            self.fs.rm(path, recursive=True)

    def delete_under(self, name: str, chosen: Callable[[str], object]) -> None:
        """Delete what lies under directory ``name`` whose path relative to it is ``chosen``: one listing,
        then (on S3) bulk deletes of the chosen files and directory markers."""
        root = self.path(name)
        try:
            found = self.fs.find(root, withdirs=True, detail=True)
        except FileNotFoundError:
            return
        picked = {p: info for p, info in found.items() if p.startswith(root + "/") and chosen(p[len(root) + 1 :])}
        if is_s3(self.fs):
            delete_listed(self.fs, picked)
            return
        for path in sorted(picked, key=lambda p: p.count("/")):  # outermost first: rm takes what is inside
            if self.fs.exists(path):
                self.fs.rm(path, recursive=True)

    def delete_files(self, relatives: Iterable[str]) -> None:
        """Delete the files ``relatives`` that exist (not directories): on S3 one bulk request per 1,000, then one
        for the directories they leave empty (a store with directories keeps them, and listings show them)."""
        paths = [self.path(rel) for rel in sorted(set(relatives))]
        if not paths:
            return
        for path in paths:
            fault_point("storage.delete", file=posixpath.basename(path))
        if is_s3(self.fs):
            ancestors = {a for p in paths for a in _ancestors(p, self.base)}  # stores with directories keep them
            delete_listed(self.fs, {p: {"type": "file"} for p in paths}, sorted(ancestors, key=lambda a: -a.count("/")))
            return
        for path in paths:
            if self.fs.isfile(path):
                self.fs.rm_file(path)

    def files_under(self, name: str, findings: list[str]) -> list[str]:
        """The files under ``name`` (relative to :attr:`base`; ``""``: all). On a local filesystem a link
        leading out of :attr:`base` is appended to ``findings`` and not followed (nothing behind it is listed)."""
        if not is_local(self.fs):
            return [self.relative(f) for f in self.fs.find(self.path(name))]
        files = []
        for directory, dirs, names in os.walk(os.path.join(self.base, name)):
            for entry in [*dirs, *names]:
                full = os.path.join(directory, entry)
                try:
                    self.path(self.relative(full))
                except UnsafePathError as e:
                    findings.append(str(e))
                    if entry in dirs:
                        dirs.remove(entry)
                    continue
                if entry in names:
                    files.append(self.relative(full))
        return files

    def handle_for(self, relative: str, key_groups: tuple[int, int] | None = None) -> StateHandle:
        full = self.path(relative)
        return StateHandle(relative, int(self.fs.size(full)), file_checksum(self.fs, full), key_groups)

    def read_verified(self, handle: StateHandle, deep: bool = True) -> bytes:
        """The bytes of ``handle``'s file, read once; :class:`CheckpointStorageError` naming the file if it is
        missing or altered (its size; with ``deep`` also its SHA-256)."""
        try:
            data = read_object(self.fs, self.path(handle.path))
        except FileNotFoundError:
            raise CheckpointStorageError(f"state file missing: {self.url(handle.path)}") from None
        if len(data) != handle.size:
            raise CheckpointStorageError(
                f"state file corrupt: {self.url(handle.path)} has {len(data)} bytes, expected {handle.size}"
            )
        if deep and checksum_of([data]) != handle.checksum:
            raise CheckpointStorageError(f"state file corrupt: checksum mismatch for {self.url(handle.path)}")
        return data

    def verify(self, handle: StateHandle, deep: bool = True, listed_size: int | None = None) -> None:
        """Raise :class:`CheckpointStorageError` naming the file if it is missing or altered
        (its size; with ``deep`` also its SHA-256: the file is read once). ``listed_size``: its size
        as a listing in this task found it, else it is asked (one request on an object store)."""
        if deep:
            self.read_verified(handle)
            return
        size = listed_size
        if size is None:
            try:
                info = self.fs.info(self.path(handle.path))
            except FileNotFoundError:
                info = None
            if info is None or info.get("type") != "file":
                raise CheckpointStorageError(f"state file missing: {self.url(handle.path)}")
            size = int(info["size"])
        if size != handle.size:
            raise CheckpointStorageError(
                f"state file corrupt: {self.url(handle.path)} has {size} bytes, expected {handle.size}"
            )

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

    # -- checkpoints -------------------------------------------------------------------
    def list_checkpoints(self) -> dict[str, Any]:
        """Every file and directory in the ``chk-*`` directories, relative path to its ``find`` info:
        on S3 one listing (a page per 1,000 entries); the job's other files (statistics) are not listed."""
        found = find_prefixed(self.fs, self.job_dir, "chk-")
        return {self.relative(p): info for p, info in found.items() if p != self.job_dir}

    def delete_listed_dirs(self, directories: Collection[str], listing: Mapping[str, Any]) -> None:
        """Delete the directories ``directories`` (relative) and what ``listing`` (as
        :meth:`list_checkpoints` answers) names in them: on S3 bulk DELETEs of what was listed
        (at most 1,000 keys a request), no further listing; elsewhere each directory recursively."""
        if not directories:
            return
        if not is_s3(self.fs):
            for directory in sorted(directories):
                self.delete(directory)
            return
        inside = tuple(d + "/" for d in directories)
        found = {self.path(p): info for p, info in listing.items() if p.startswith(inside)}
        found.update({self.path(d): {"type": "directory"} for d in directories})
        delete_listed(self.fs, found)

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
