"""Confinement of paths: user-given URLs to allowed roots, relative paths to their base.

A URL (UI param, restore request, savepoint target) is accepted only if it is a plain
path — nothing that URL parsing would strip or decode — with the scheme and host of an
allowed root, no ``..`` segment, and lies under that root. A relative path (from a stored
document) resolves only inside its base directory.

The one rule for effects: every path that is read, deleted, moved or created goes through
:func:`owned_path` (or :class:`~.job_storage.Location`, which calls it) with the directory
that owns it — a job directory, a table, a landing or archive directory, a savepoint. On
local filesystems the path is resolved first (symlinks followed), and one whose real
location leaves the owner's real directory is refused: no effect ever follows a link out.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from airflow_provider_checkpoint.core.documents import path_problem
from airflow_provider_checkpoint.exceptions import UnsafePathError, redact, shorten

_LOCAL = {"", "file", "local"}
_LOCAL_PROTOCOLS = {"file", "local"}
OUTSIDE_RULE = "outside the directory that owns it (no effect follows a link out of its owner)"
_NOT_PLAIN = re.compile(r"[\x00-\x1f\x7f\\?#%]")


def _split(url: str) -> tuple[str, str, str]:
    parts = urlsplit(url)
    scheme = "file" if parts.scheme in _LOCAL else parts.scheme
    return scheme, parts.netloc, parts.path


def resolve_under_roots(candidate: str, roots: Sequence[str]) -> str:
    """The normalized URL of ``candidate`` if it lies under one of ``roots``.

    Raises :class:`UnsafePathError` naming the allowed roots otherwise.
    """
    allowed = redact(", ".join(roots)) or "(none configured)"
    shown = shorten(candidate)
    if not candidate or _NOT_PLAIN.search(candidate) or candidate != candidate.strip():
        raise UnsafePathError(
            f"path {shown} is not a plain path (control characters, surrounding spaces, '\\', '?', '#' "
            f"and '%' are refused rather than silently changed); allowed roots: {allowed}"
        )
    scheme, netloc, path = _split(candidate)
    if not path.startswith("/"):
        raise UnsafePathError(f"path {shown} must be absolute; allowed roots: {allowed}")
    if ".." in path.split("/"):
        raise UnsafePathError(f"path {shown} contains '..'; allowed roots: {allowed}")
    normalized = posixpath.normpath(path)
    for root in roots:
        r_scheme, r_netloc, r_path = _split(root)
        if (r_scheme, r_netloc) != (scheme, netloc):
            continue
        r_path = posixpath.normpath(r_path)
        if scheme == "file":
            real, real_root = os.path.realpath(normalized), os.path.realpath(r_path)
            if within(real, real_root):
                return f"file://{real}"
        elif within(normalized, r_path):
            return f"{scheme}://{netloc}{normalized}"
    raise UnsafePathError(f"path {shown} is outside the allowed roots: {allowed}")


def within(real: str, real_root: str) -> bool:
    return real == real_root or real.startswith(real_root.rstrip("/") + "/")


def confine(base: str, relative: str, local: bool) -> str:
    """``base/relative`` if ``relative`` is a safe relative path that stays inside ``base``.

    On a local filesystem the result is resolved (symlinks followed) and must still lie
    inside the resolved ``base``. Raises :class:`UnsafePathError` otherwise.
    """
    problem = path_problem(relative, strict=False)
    if problem:
        raise UnsafePathError(f"refusing path {relative!r} under {base}: it {problem}")
    full = f"{base}/{relative}"
    if local:
        real, real_base = os.path.realpath(full), os.path.realpath(base)
        if not within(real, real_base):
            raise UnsafePathError(f"refusing {full}: it resolves to {real}, {OUTSIDE_RULE} ({real_base})")
    return full


def is_local(fs: Any) -> bool:
    """Whether an fsspec filesystem is the local one (where symlinks exist and are resolved)."""
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return bool(_LOCAL_PROTOCOLS & set(protocols))


def refuse_links(fs: Any, directory: str, paths: Sequence[str], what: str) -> None:
    """Refuse, on a local filesystem, any of ``paths`` (absolute, under ``directory``) that is a symbolic link
    or is reached through one below ``directory`` (its real location is not ``directory``'s real one joined
    with its relative path): a staged file is published or committed only as the file its step wrote, never
    as a link to rows elsewhere, outside or inside the table. Object stores have no links."""
    if not is_local(fs):
        return
    real_directory = os.path.realpath(directory)
    for path in paths:
        relative = posixpath.relpath(path, directory)
        outside = relative == ".." or relative.startswith("../")
        if outside or os.path.realpath(path) != posixpath.join(real_directory, relative):
            raise UnsafePathError(
                f"refusing {what} {path}: it is a symbolic link or reached through one below {directory} "
                "(a staged file is committed only as the file its step wrote)"
            )


def owned_path(fs: Any, base: str, relative: str) -> str:
    """``base/relative`` on ``fs``, confined to the directory ``base`` that owns it (:func:`confine`)."""
    return confine(base, relative, is_local(fs))
