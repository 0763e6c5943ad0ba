"""Confinement of user-given paths (UI params) to allowed roots.

A path is accepted only if it has the scheme and host of an allowed root, no ``..``
segment, and lies under that root; on local filesystems symlinks are resolved first,
so a link cannot lead outside. Checked before anything is read or written.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from urllib.parse import urlsplit

_LOCAL = {"", "file", "local"}


class UnsafePathError(ValueError):
    """A user-given path lies outside every allowed root, or is not a plain path."""


def _split(url: str) -> tuple[str, str, str]:
    parts = urlsplit(url)
    scheme = "file" if parts.scheme in _LOCAL else parts.scheme
    return scheme, parts.netloc, parts.path


def resolve_under_roots(candidate: str, roots: Sequence[str]) -> str:
    """The normalized URL of ``candidate`` if it lies under one of ``roots``.

    Raises :class:`UnsafePathError` naming the allowed roots otherwise.
    """
    allowed = ", ".join(roots) or "(none configured)"
    if not candidate or "\x00" in candidate or "\\" in candidate:
        raise UnsafePathError(f"path {candidate!r} is not a plain path; allowed roots: {allowed}")
    scheme, netloc, path = _split(candidate.strip())
    if not path.startswith("/"):
        raise UnsafePathError(f"path {candidate!r} must be absolute; allowed roots: {allowed}")
    if ".." in path.split("/"):
        raise UnsafePathError(f"path {candidate!r} contains '..'; allowed roots: {allowed}")
    normalized = posixpath.normpath(path)
    for root in roots:
        r_scheme, r_netloc, r_path = _split(root)
        if (r_scheme, r_netloc) != (scheme, netloc):
            continue
        r_path = posixpath.normpath(r_path)
        if scheme == "file":
            real, real_root = os.path.realpath(normalized), os.path.realpath(r_path)
            if real == real_root or real.startswith(real_root.rstrip("/") + "/"):
                return f"file://{real}"
        elif normalized == r_path or normalized.startswith(r_path.rstrip("/") + "/"):
            return f"{scheme}://{netloc}{normalized}"
    raise UnsafePathError(f"path {candidate!r} is outside the allowed roots: {allowed}")
