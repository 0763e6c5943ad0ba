"""Atomic and exclusive writes on any fsspec filesystem: local files and object stores.

Locally a file appears under its name only when complete (temporary name, then rename or
hard link). On object stores one PUT of the whole object is atomic by itself, and a
conditional PUT (``If-None-Match: *``) is the exclusive create: never a rename.
"""

from __future__ import annotations

import os
import posixpath
import uuid

from fsspec import AbstractFileSystem

from airflow_provider_checkpoint.core.faults import fault_point
from airflow_provider_checkpoint.storage.object_store import is_s3, precondition_failed
from airflow_provider_checkpoint.storage.paths import is_local


def write_atomic(fs: AbstractFileSystem, path: str, data: bytes) -> None:
    """Readers see the old content or the new, never a partial file.

    Locally: a temporary name renamed into place. On object stores: one PUT of the whole
    object (never a rename, which object stores do not have atomically).
    """
    fault_point("storage.write", file=posixpath.basename(path))
    if not is_s3(fs):
        fs.makedirs(posixpath.dirname(path), exist_ok=True)  # object stores have no directories to make
    if is_local(fs):
        tmp = f"{posixpath.dirname(path)}/.{posixpath.basename(path)}.{uuid.uuid4().hex}.tmp"
        fs.pipe_file(tmp, data)
        fs.mv(tmp, path)
    else:
        fs.pipe_file(path, data)


def create_exclusive(fs: AbstractFileSystem, path: str, data: bytes) -> bool:
    """Create ``path`` with ``data`` only if it does not exist; True if this call created it.

    Exactly one of any number of concurrent callers gets True, and nobody ever sees the
    file without its content: locally it is written under a temporary name and
    hard-linked into place (``link`` fails if the name exists); on object stores it is one
    conditional PUT (``If-None-Match: *``), which the store refuses if the key exists
    (other filesystems: their own exclusive open, ``xb``).
    A retried PUT whose first attempt landed also reports False: callers re-read the
    winner's document, which is then their own.
    """
    fault_point("storage.write", file=posixpath.basename(path))
    if not is_s3(fs):
        fs.makedirs(posixpath.dirname(path), exist_ok=True)
    if is_local(fs):
        tmp = f"{posixpath.dirname(path)}/.{posixpath.basename(path)}.{uuid.uuid4().hex}.tmp"
        fs.pipe_file(tmp, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        return True
    try:
        if is_s3(fs):
            fs.pipe_file(path, data, mode="create")  # s3fs: PUT with If-None-Match: *
        else:
            with fs.open(path, "xb") as f:
                f.write(data)
    except OSError as e:
        if isinstance(e, FileExistsError) or precondition_failed(e):
            return False
        raise
    return True
