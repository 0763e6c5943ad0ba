"""The files of a sink's table directory with as few requests as an object store can answer.

On S3 every request counts (and is billed): ``fs.exists`` on a missing path costs a HEAD and a
LIST, ``fs.open`` for reading a HEAD before the first GET, ``fs.mv`` a HEAD, two LISTs, a copy
and a DELETE. The helpers here cost:

- :func:`list_tree`, :func:`list_names`: one LIST (up to 1000 entries per page), sizes included,
  so what was listed needs no HEAD;
- :func:`read_document`, :func:`~airflow_provider_checkpoint.storage.object_store.read_object`: one GET;
- :func:`publish`: one server-side copy (``CopyObject``), which replaces the target atomically:
  readers see the old object or the new one, never a part;
- :func:`delete_tree`: one bulk DELETE of a listed tree and its directory markers.

On local filesystems they keep the POSIX behaviour: :func:`publish` renames (atomic), and
:func:`delete_tree` removes the directory.
"""

from __future__ import annotations

import posixpath

from fsspec import AbstractFileSystem

from airflow_provider_checkpoint.storage.object_store import call_s3_each, delete_listed, is_s3, read_object
from airflow_provider_checkpoint.storage.paths import is_local

Listing = dict[str, int]
"""Files found by one listing: full path on the filesystem → size in bytes."""

COPY_OBJECT_BYTES = 5 * 1024**3
"""The largest object one ``CopyObject`` copies; larger ones take a multipart copy."""


def list_tree(fs: AbstractFileSystem, directory: str) -> Listing:
    """Every file under ``directory`` (empty if it does not exist): one LIST on S3."""
    if is_s3(fs):  # a prefix keeps s3fs from a HEAD and a second LIST when nothing is there
        parent, name = posixpath.split(directory)
        found = fs.find(parent, prefix=f"{name}/", detail=True)
    else:
        found = fs.find(directory, detail=True)
    return {path: int(info["size"]) for path, info in found.items() if info["type"] != "directory"}


def list_names(fs: AbstractFileSystem, directory: str, prefix: str) -> Listing:
    """The files directly in ``directory`` whose name starts with ``prefix``: one LIST on S3."""
    found = fs.find(directory, maxdepth=1, prefix=prefix, detail=True)  # local: no prefix filter, one readdir
    return {
        path: int(info["size"])
        for path, info in found.items()
        if info["type"] != "directory" and posixpath.basename(path).startswith(prefix)
    }


def read_document(fs: AbstractFileSystem, path: str) -> bytes | None:
    """The content of the small document ``path``, ``None`` if it does not exist: one GET on S3."""
    try:
        return read_object(fs, path)
    except FileNotFoundError:
        return None


def publish(fs: AbstractFileSystem, staged: str, size: int, target: str) -> None:
    """Make ``staged`` (of ``size`` bytes) the content of ``target``, atomically for readers.

    Locally a rename (``staged`` is gone after it). On object stores a server-side copy: one
    request on S3 for objects up to :data:`COPY_OBJECT_BYTES`; ``staged`` stays, so a commit
    that stops half-way can publish it again, and its directory is deleted in one request at the end.
    """
    if is_local(fs):
        fs.mv(staged, target)
    elif is_s3(fs) and size <= COPY_OBJECT_BYTES:
        bucket, key, _ = fs.split_path(staged)
        to_bucket, to_key, _ = fs.split_path(target)
        fs.call_s3("copy_object", Bucket=to_bucket, Key=to_key, CopySource={"Bucket": bucket, "Key": key})
    else:
        fs.copy(staged, target)


def publish_all(fs: AbstractFileSystem, moves: list[tuple[str, int, str]]) -> None:
    """:func:`publish` each ``(staged, size, target)`` of ``moves``, in order: on S3, when the targets differ,
    the copies run concurrently (:func:`.object_store.call_s3_each`), each atomic for readers as one copy is;
    all have ended when it returns."""
    targets = {target for _, _, target in moves}
    if not is_s3(fs) or len(targets) < max(len(moves), 2) or any(size > COPY_OBJECT_BYTES for _, size, _ in moves):
        for staged, size, target in moves:
            publish(fs, staged, size, target)
        return
    requests = []
    for staged, _, target in moves:
        bucket, key, _ = fs.split_path(staged)
        to_bucket, to_key, _ = fs.split_path(target)
        requests.append({"Bucket": to_bucket, "Key": to_key, "CopySource": {"Bucket": bucket, "Key": key}})
    call_s3_each(fs, "copy_object", requests)


def delete_tree(fs: AbstractFileSystem, directory: str, listing: Listing, owner: str) -> None:
    """Delete ``directory``, whose files ``listing`` holds (as :func:`list_tree` returned it).

    On S3 one bulk DELETE (per 1000 keys, :func:`.object_store.delete_listed`) of the files, then in
    the same request the directory markers a store backed by a file tree (SeaweedFS) keeps: those of
    ``directory``, of every directory in it and of its ancestors below ``owner`` (never ``owner`` or
    above), deepest first (a store keeps a marker whose directory still holds something; S3 ignores
    keys that do not exist). Nothing listed: no request. Elsewhere ``directory`` is removed if it exists.
    """
    if not is_s3(fs):
        if fs.exists(directory):
            fs.rm(directory, recursive=True)
        return
    below = owner.rstrip("/") + "/"
    markers: set[str] = set()
    for path in listing:
        parent = posixpath.dirname(path)
        while parent.startswith(below) and parent not in markers:
            markers.add(parent)
            parent = posixpath.dirname(parent)
    files = {path: {"type": "file"} for path in listing}
    delete_listed(fs, files, sorted(markers, key=lambda m: (-m.count("/"), m)))
