"""Listing and cleaning a landing directory through fsspec (no Spark)."""

from __future__ import annotations

import fnmatch
import posixpath
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import fsspec

from airflow_provider_checkpoint.exceptions import PipelineDefinitionError, shorten

CLEAN_SOURCE = ("off", "archive", "delete")
"""What a file source does with a file once the checkpoint that read it committed."""


def hidden(relative: str) -> bool:
    """Whether a relative name or one of its directories starts with ``.`` or ``_``."""
    return any(part.startswith((".", "_")) for part in relative.split("/"))


def modification_time(info: dict[str, Any]) -> float:
    """A file's modification time from an fsspec ``info`` (local, S3, GCS, HDFS spellings); 0 if none."""
    for key in ("mtime", "LastModified", "last_modified", "updated"):
        value = info.get(key)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return 0.0


@dataclass
class Listing:
    """Visible files (relative name → size, modification time) and the partition date of those in one."""

    files: dict[str, tuple[int, float]]
    partitions: dict[str, datetime]


def list_landing(
    fs: fsspec.AbstractFileSystem,
    root: str,
    pattern: str,
    partition_pattern: str | None,
    floor: datetime | None,
) -> Listing:
    """Every visible file under ``root`` whose base name matches ``pattern``.

    With ``partition_pattern`` (a ``strptime`` format of the partition directories, for
    example ``dt=%Y-%m-%d`` or ``%Y/%m/%d``), partitions dated before ``floor`` are not
    listed at all, so the listing costs the open partitions, not the job's age.
    Directories that do not match the pattern are listed in full.
    """
    listing = Listing({}, {})

    def add(full: str, info: dict[str, Any], partition: datetime | None) -> None:
        rel = full[len(root) + 1 :]
        if info.get("type") == "file" and not hidden(rel) and fnmatch.fnmatch(posixpath.basename(rel), pattern):
            listing.files[rel] = (int(info["size"]), modification_time(info))
            if partition is not None:
                listing.partitions[rel] = partition

    if partition_pattern is None:
        for full, info in fs.find(root, detail=True).items():
            add(full, info, None)
        return listing
    depth = partition_pattern.count("/") + 1
    for full, info in fs.find(root, maxdepth=depth, withdirs=True, detail=True).items():
        rel = full[len(root) + 1 :]
        if not rel:  # the landing directory itself
            continue
        if hidden(rel) or info.get("type") != "directory" or rel.count("/") != depth - 1:
            add(full, info, None)
            continue
        try:
            partition: datetime | None = datetime.strptime(rel, partition_pattern)
        except ValueError:
            partition = None
        if partition is not None and floor is not None and partition < floor:
            continue
        for sub, sub_info in fs.find(full, detail=True).items():
            add(sub, sub_info, partition)
    return listing


def clean_file(
    fs: fsspec.AbstractFileSystem, source: str, size: int, archive: tuple[fsspec.AbstractFileSystem, str] | None
) -> str:
    """Delete ``source``, or move it to ``archive``'s path; what happened, as a word.

    An archive copy of the same size means an earlier move was interrupted after the
    copy: the source is then only removed. One of another size is left alone (``kept``).
    """
    if archive is None:
        fs.rm(source)
        return "deleted"
    archive_fs, target = archive
    if archive_fs.exists(target):
        if archive_fs.size(target) != size:
            return "kept"
        fs.rm(source)
        return "archived"
    archive_fs.makedirs(posixpath.dirname(target), exist_ok=True)
    fs.mv(source, target)
    return "archived"


def check_clean_source(uid: str, path: str, clean_source: str, archive_dir: str | None) -> None:
    """Refuse, when the pipeline is defined, a ``clean_source`` other than :data:`CLEAN_SOURCE`'s, an
    ``archive_dir`` without ``"archive"`` or the reverse, and an archive on another filesystem than the landing
    directory ``path`` or inside it, unless under a hidden name (its files would be read again)."""
    if clean_source not in CLEAN_SOURCE:
        raise PipelineDefinitionError(f"{uid}: clean_source must be one of {CLEAN_SOURCE}, got {clean_source!r}")
    if (clean_source == "archive") != (archive_dir is not None):
        raise PipelineDefinitionError(f"{uid}: archive_dir is required with clean_source='archive' and only then")
    if archive_dir is None:
        return
    (landing_protocol, landing), (archive_protocol, archive) = map(fsspec.core.split_protocol, (path, archive_dir))
    if (landing_protocol or "file") != (archive_protocol or "file"):
        raise PipelineDefinitionError(
            f"{uid}: archive_dir {shorten(archive_dir)} must be on the filesystem of {shorten(path)}"
        )
    landing, archive = posixpath.normpath(landing), posixpath.normpath(archive)
    inside = posixpath.relpath(archive, landing) if archive.startswith(landing.rstrip("/") + "/") else None
    if archive == landing or (inside is not None and not hidden(inside)):
        raise PipelineDefinitionError(
            f"{uid}: archive_dir {shorten(archive_dir)} lies in the landing directory, so archived files would be read "
            "again; put it elsewhere or under a hidden name (starting with '.' or '_')"
        )
