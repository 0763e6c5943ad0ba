"""Table and directory URLs made from a path alone (a sink's Asset URI, a source's landing check): declaring
a pipeline resolves no connection and opens no filesystem."""

from __future__ import annotations

import posixpath

import fsspec

from airflow_provider_checkpoint.exceptions import CheckpointStorageError, shorten

_LOCAL = ("file", "local")


def url_of(protocol: str | tuple[str, ...], path: str) -> str:
    """``path`` of a filesystem speaking ``protocol`` as a URL (``file://`` for local paths)."""
    name = protocol[0] if isinstance(protocol, tuple) else protocol
    return f"{'file' if name in _LOCAL else name}://{path}"


class _S3Paths(fsspec.AbstractFileSystem):
    """S3 paths as ``s3fs.S3FileSystem`` strips them (fsspec's own rule, its protocols and root), without
    importing s3fs: 0.4 s of aiobotocore and aiohttp in every DAG parse that declares an S3 sink."""

    protocol = ("s3", "s3a")
    root_marker = ""


def _installed(package: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(package) is not None


def table_url(uid: str, path: str) -> str:
    """The URL of a table or directory ``path`` (a local path or fsspec URL) from the path alone, normalized
    (absolute, no ``.``/``..`` or trailing ``/``): declaring a pipeline resolves no connection and opens no
    filesystem (the DAG processor parses the file; only tasks reach storage)."""
    protocol = fsspec.core.split_protocol(path)[0] or "file"
    try:
        kind = (
            _S3Paths if protocol in _S3Paths.protocol and _installed("s3fs") else fsspec.get_filesystem_class(protocol)
        )
    except (ValueError, ImportError) as e:  # unknown scheme, or its filesystem package is missing
        raise CheckpointStorageError(f"{uid}: no filesystem serves {shorten(path)}: {e}") from e
    stripped = kind._strip_protocol(path)
    normalized = posixpath.abspath(stripped) if protocol in _LOCAL else posixpath.normpath(stripped)
    return url_of(kind.protocol, normalized.rstrip("/"))


def known_table_url(uid: str, path: str) -> str | None:
    """:func:`table_url`, or ``None`` where no installed filesystem serves ``path`` (nothing to compare it with:
    a sink there could not be declared)."""
    try:
        return table_url(uid, path)
    except CheckpointStorageError:
        return None
