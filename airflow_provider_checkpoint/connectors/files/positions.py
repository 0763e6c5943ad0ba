"""Positions of a :class:`~airflow_provider_checkpoint.connectors.files.source.FileSource` (pure Python).

A position is ``{"files": {relative_name: size}}``: the files already processed **that
were still visible** when the barrier was cut. A visible file that the position does
not list has not been processed, whatever its age, so a file is read by exactly one
completed checkpoint without the position remembering every file ever processed: a file
that leaves the landing directory (``clean_source``, a lifecycle rule, a user's own
retention) or the listed partitions leaves the position at the next barrier. The size of
the position is therefore bounded by the processed files still visible, not by the age
of the job. Positions of earlier versions (every file ever processed) have the same
shape and shrink at the first barrier.

With date partitions, the position also holds ``partition_floor``: partitions dated
before it are closed, no longer listed, and their files leave the position. The floor
follows the newest partition at a distance of the partition lateness, and never passes
a partition that still has a visible file not yet processed.

Positions are stored documents (plan XCom, ``_plan.json``, ``_metadata``): every one read
back is validated (:func:`validate_position`).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from airflow_provider_checkpoint.exceptions import InputChangedError, InvalidPositionError, shorten

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_relative_name(uid: str, name: object) -> str:
    """``name`` if it is a normalized relative POSIX file name, else :class:`InvalidPositionError`."""
    problem = None
    if not isinstance(name, str) or not name:
        problem = "is not a non-empty string"
    elif _CONTROL.search(name) or "\\" in name:
        problem = "contains a control character or a backslash"
    elif name.startswith("/") or _SCHEME.match(name):
        problem = "is absolute or has a scheme"
    elif posixpath.normpath(name) != name or any(part in ("", ".", "..") for part in name.split("/")):
        problem = "is not a normalized relative path without '..'"
    if problem:
        raise InvalidPositionError(f"source {uid}: file name {name!r} in a stored position {problem}")
    return str(name)


class Position(NamedTuple):
    files: dict[str, int]
    partition_floor: datetime | None = None


def validate_position(uid: str, position: object) -> Position:
    """A stored position, validated; ``None`` is the initial (empty) position."""
    if position is None:
        return Position({})
    files = position.get("files") if isinstance(position, Mapping) else None
    if not isinstance(position, Mapping) or not isinstance(files, Mapping):
        raise InvalidPositionError(f"source {uid}: stored position {shorten(position)} has no 'files' object")
    checked: dict[str, int] = {}
    for name, size in files.items():
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise InvalidPositionError(f"source {uid}: size {size!r} of {name!r} in a stored position is not a size")
        checked[check_relative_name(uid, name)] = size
    floor = position.get("partition_floor")
    if floor is None:
        return Position(checked)
    try:
        return Position(checked, datetime.fromisoformat(floor))
    except (TypeError, ValueError):
        raise InvalidPositionError(f"source {uid}: partition_floor {shorten(floor)} is not an ISO date") from None


def next_position(
    previous: Position,
    visible: Mapping[str, tuple[int, float]],
    max_files: int | None,
    partitions: Mapping[str, datetime] | None = None,
    lateness: timedelta = timedelta(0),
) -> dict[str, Any]:
    """The barrier position: processed files still visible, plus the new files this checkpoint reads.

    ``visible`` maps each visible file to ``(size, modification time)``. New files are
    taken oldest first (modification time, then name), at most ``max_files`` of them, so a
    backlog is split over several checkpoints in a deterministic order. ``partitions``
    (date-partitioned sources) gives the partition date of files in a partition.
    """
    files = {name: size for name, size in previous.files.items() if name in visible}
    new = sorted((n for n in visible if n not in previous.files), key=lambda n: (visible[n][1], n))
    if max_files is not None:
        new = new[:max_files]
    files.update((n, visible[n][0]) for n in new)
    if partitions is None:
        return {"files": dict(sorted(files.items()))}
    floor = previous.partition_floor
    if partitions:
        unread = [partitions[n] for n in visible if n in partitions and n not in previous.files]
        candidate = min([max(partitions.values()) - lateness, *unread])
        floor = candidate if floor is None else max(floor, candidate)
    if floor is not None:
        files = {n: s for n, s in files.items() if n not in partitions or partitions[n] >= floor}
    position: dict[str, Any] = {"files": dict(sorted(files.items()))}
    if floor is not None:
        position["partition_floor"] = floor.isoformat()
    return position


def split(previous: Mapping[str, int], barrier: Mapping[str, int]) -> dict[str, int]:
    """The files in ``[previous, barrier)``: in the barrier, not yet processed."""
    return {name: size for name, size in barrier.items() if name not in previous}


def check_unchanged(uid: str, todo: Mapping[str, int], now: Mapping[str, int], url: Callable[[str], str]) -> None:
    """Refuse (:class:`InputChangedError`) a file of ``todo`` (name → its size cut into the barrier) that is
    not in ``now`` (name → size, listed just now) or has another size there; ``url`` names a file."""
    for name, size in todo.items():
        if name not in now:
            raise InputChangedError(
                f"source {uid}: {url(name)} was cut into this checkpoint's barrier but "
                "has been removed; this checkpoint is aborted and the next one cuts a new barrier"
            )
        if now[name] != size:
            raise InputChangedError(
                f"source {uid}: {url(name)} changed size after the barrier "
                f"({size} → {now[name]} bytes); land files under a hidden name (.x or _x) and "
                "rename them when complete"
            )
