"""The checksum a state handle records of a file's bytes (``sha256:<hex>``): one definition for every writer
and reader of state files, so the two cannot drift."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


class Checksum:
    """The checksum a handle records of bytes fed in order (:meth:`update`): :attr:`value`, ``sha256:<hex>``."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256()

    def update(self, chunk: bytes) -> None:
        self._digest.update(chunk)

    @property
    def value(self) -> str:
        return "sha256:" + self._digest.hexdigest()


def checksum_of(chunks: Iterable[bytes]) -> str:
    """The :class:`Checksum` of the bytes ``chunks`` hold, in order."""
    checksum = Checksum()
    for chunk in chunks:
        checksum.update(chunk)
    return checksum.value
