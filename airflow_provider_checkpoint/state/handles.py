"""State handles: where a checkpoint's state files are, what they hold, how they are checked.

A handle names a file relative to the job directory (``chk-<id>/...``), its size and
SHA-256; inline state carries small Parquet in the document itself. Every ``from_dict``
confines paths to the checkpoint (``HandleScope``) before anything reads them.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from typing import Any

from airflow_provider_checkpoint.core.checksums import checksum_of
from airflow_provider_checkpoint.core.documents import CHECKSUM, Fields, JsonDict
from airflow_provider_checkpoint.core.event_time import WatermarkProgress

_CHK_SEGMENT = re.compile(r"^chk-(\d{1,19})$")
_BASE64 = re.compile(r"^[A-Za-z0-9+/]*={0,2}$")
MAX_KEY_GROUPS = 32768
NOTHING_CLOSES = (1 << 63) - 1
"""``least_end`` of a file that holds no live row: no watermark closes anything in it."""


@dataclass(frozen=True)
class StateHandle:
    """One state file: where it is (relative to the job directory), how big, its SHA-256.

    ``key_groups`` is the inclusive key-group range the file holds, when it holds keyed
    state; rescaling reads files by key group, never by the Spark partition that wrote them.
    ``delta`` is set on a file of incremental state: the id of the checkpoint whose changes
    (new rows and tombstones of the keys that changed) it holds; unset, the file holds a
    full version of its range.
    ``least_end``: of an event-time operator's file, the least value (µs since the epoch) of its
    closing column (:meth:`~.StatefulOperator.closes_below`) over the live rows (tombstones left out),
    :data:`NOTHING_CLOSES` when it has none; unset, not recorded (files written before it was, or by
    a write that knew no closing column): the file's footer tells.
    """

    path: str
    size: int
    checksum: str
    key_groups: tuple[int, int] | None = None
    delta: int | None = None
    least_end: int | None = None

    def to_dict(self) -> JsonDict:
        d: JsonDict = {"path": self.path, "size": self.size, "checksum": self.checksum}
        if self.key_groups is not None:
            d["key_groups"] = list(self.key_groups)
        if self.delta is not None:
            d["delta"] = self.delta
        if self.least_end is not None:
            d["least_end"] = self.least_end
        return d

    @classmethod
    def from_dict(cls, d: Any, document: str = "state handle", where: str = "") -> StateHandle:
        f = Fields(d, document, where)
        key_groups = None
        if f.has("key_groups"):
            kg = f.items("key_groups")
            if not (
                len(kg) == 2
                and all(isinstance(k, int) and not isinstance(k, bool) for k in kg)
                and 0 <= kg[0] <= kg[1] < MAX_KEY_GROUPS
            ):
                raise f.error("key_groups", f"must be [first, last] with 0 <= first <= last < {MAX_KEY_GROUPS}", kg)
            key_groups = (kg[0], kg[1])
        delta = f.integer("delta", 1, default=None)
        path = f.path("path")
        if delta is not None and (key_groups is None or not path.startswith(f"chk-{delta}/")):
            raise f.error("delta", f"a delta needs key_groups and must lie under chk-{delta}/", delta)
        return cls(
            path=path,
            size=f.integer("size"),
            checksum=f.string("checksum", CHECKSUM),
            key_groups=key_groups,
            delta=delta,
            least_end=f.integer("least_end", -(1 << 63), NOTHING_CLOSES, default=None),
        )


@dataclass(frozen=True)
class HandleScope:
    """Where the state handles of a snapshot may lie, relative to the directory they resolve under.

    ``attempt_dir``: an ack's files lie in its own attempt directory, or are files of older
    checkpoints it keeps (incremental state; finalize checks that they are its restore
    point's). Otherwise a checkpoint's files lie in ``chk-<n>/`` with ``n`` at most its own
    id, and a relocatable savepoint's in ``state/<uid>/``. Savepoints hold no deltas.
    """

    checkpoint_id: int
    relocatable: bool | None = False
    """``None`` accepts either layout (a restore point passed on by the trigger)."""
    attempt_dir: str | None = None

    def problem(self, uid: str, handle: StateHandle) -> str | None:
        path = handle.path
        m = _CHK_SEGMENT.match(path.split("/", 1)[0])
        if self.attempt_dir is not None:
            if path.startswith(self.attempt_dir + "/") or (m and 1 <= int(m.group(1)) < self.checkpoint_id):
                return None
            return f"must lie under {self.attempt_dir}/ or chk-<n>/ (n < {self.checkpoint_id})"
        if handle.delta is not None and (self.relocatable or handle.delta > self.checkpoint_id):
            return f"a delta of checkpoint {handle.delta} cannot be part of this snapshot"
        if self.relocatable is not False and path.startswith(f"state/{uid}/"):
            return None
        if self.relocatable is not True and m and 1 <= int(m.group(1)) <= self.checkpoint_id:
            return None
        if self.relocatable:
            return f"must lie under state/{uid}/ of the savepoint"
        return f"must lie under chk-<n>/ (n <= {self.checkpoint_id}) of the job directory"


MAX_INLINE_STATE = 64 << 20
"""No inline state (memory checkpoint storage) beyond 64 MiB, whatever the settings say."""


@dataclass(frozen=True)
class InlineState:
    """Small state carried in the ack and ``_metadata`` itself: a Parquet file, base64-encoded."""

    data: str
    size: int
    checksum: str

    @classmethod
    def of(cls, parquet: bytes) -> InlineState:
        return cls(base64.b64encode(parquet).decode(), len(parquet), checksum_of([parquet]))

    def parquet(self) -> bytes | None:
        """The Parquet bytes, or ``None`` if they do not match the recorded size and checksum."""
        try:
            data = base64.b64decode(self.data, validate=True)
        except ValueError:
            return None
        return data if (len(data), checksum_of([data])) == (self.size, self.checksum) else None

    def to_dict(self) -> JsonDict:
        return {"data": self.data, "size": self.size, "checksum": self.checksum}

    @classmethod
    def from_dict(cls, d: Any, document: str, where: str) -> InlineState:
        f = Fields(d, document, where)
        return cls(
            f.string("data", _BASE64, max_length=MAX_INLINE_STATE * 4 // 3 + 4),
            f.integer("size", maximum=MAX_INLINE_STATE),
            f.string("checksum", CHECKSUM),
        )


@dataclass(frozen=True)
class OperatorSnapshot:
    """The keyed state of one operator (by ``uid``) in one checkpoint.

    ``schema`` is the Spark JSON schema of the state rows, ``keys`` the key columns and
    ``max_parallelism`` the number of key groups the keys are hashed into. The state is
    either in files (``handles``) or, when small, ``inline`` (then ``handles`` is empty).
    ``event_time``: the watermark the operator reached, when it has an event-time input.
    ``declaration``: what the state means beyond its keys (:meth:`~.StatefulOperator.state_declaration`),
    as ``(name, text)`` pairs; empty in snapshots written before it was recorded.
    """

    handles: tuple[StateHandle, ...]
    schema: str
    keys: tuple[str, ...]
    max_parallelism: int
    rows: int = 0
    inline: InlineState | None = None
    event_time: WatermarkProgress | None = None
    declaration: tuple[tuple[str, str], ...] = ()

    @property
    def size(self) -> int:
        return sum(h.size for h in self.handles) + (self.inline.size if self.inline else 0)

    def to_dict(self) -> JsonDict:
        d = {
            "handles": [h.to_dict() for h in self.handles],
            "schema": self.schema,
            "keys": list(self.keys),
            "max_parallelism": self.max_parallelism,
            "rows": self.rows,
        }
        if self.inline is not None:
            d["inline"] = self.inline.to_dict()
        if self.event_time is not None:
            d["event_time"] = self.event_time.to_dict()
        if self.declaration:
            d["declaration"] = dict(self.declaration)
        return d

    @classmethod
    def from_dict(cls, d: Any, document: str, where: str, scope: HandleScope, uid: str) -> OperatorSnapshot:
        f = Fields(d, document, where)
        max_parallelism = f.integer("max_parallelism", 1, MAX_KEY_GROUPS)
        handles = f.each("handles", lambda h, name: StateHandle.from_dict(h, document, name))
        for n, handle in enumerate(handles):
            problem = scope.problem(uid, handle)
            if problem:
                raise f.error(f"handles[{n}].path", problem, handle.path)
            if handle.key_groups and handle.key_groups[1] >= max_parallelism:
                raise f.error(f"handles[{n}].key_groups", f"exceeds max_parallelism {max_parallelism}")
        keys = f.items("keys", max_length=100)
        if not keys or not all(isinstance(k, str) and 0 < len(k) <= 1000 for k in keys):
            raise f.error("keys", "must be a non-empty list of column names", keys)
        inline = InlineState.from_dict(f.raw["inline"], document, f.name("inline")) if f.has("inline") else None
        if inline is not None and handles:
            raise f.error("inline", "cannot be given together with state files")
        return cls(
            handles=tuple(handles),
            schema=f.string("schema", max_length=1 << 20),
            keys=tuple(keys),
            max_parallelism=max_parallelism,
            rows=f.integer("rows", default=0),
            inline=inline,
            event_time=WatermarkProgress.from_dict(f.raw["event_time"], document, f.name("event_time"))
            if f.has("event_time")
            else None,
            declaration=_declaration(f),
        )


def _declaration(f: Fields) -> tuple[tuple[str, str], ...]:
    """``declaration``: an object of at most 1000 entries, names and texts of at most 1000 characters."""
    raw = f.data("declaration", default={})
    if len(raw) > 1000 or not all(isinstance(v, str) and 0 < len(k) <= 1000 and len(v) <= 1000 for k, v in raw.items()):
        raise f.error("declaration", "must map at most 1000 names to texts of at most 1000 characters")
    return tuple(sorted(raw.items()))


@dataclass(frozen=True)
class ChannelSnapshot:
    """The records one step passes to another in one checkpoint: Parquet files in its attempt directory.

    ``schema`` is the Spark JSON schema (an empty channel has no files); ``rows`` the count.
    """

    handles: tuple[StateHandle, ...]
    schema: str
    rows: int = 0

    @property
    def size(self) -> int:
        return sum(h.size for h in self.handles)

    def to_dict(self) -> JsonDict:
        return {"handles": [h.to_dict() for h in self.handles], "schema": self.schema, "rows": self.rows}

    @classmethod
    def from_dict(cls, d: Any, document: str, where: str, attempt_dir: str, uid: str) -> ChannelSnapshot:
        f = Fields(d, document, where)
        handles = f.each("handles", lambda h, name: StateHandle.from_dict(h, document, name))
        for n, handle in enumerate(handles):
            if not handle.path.startswith(f"{attempt_dir}/channels/{uid}/"):
                raise f.error(f"handles[{n}].path", f"must lie under {attempt_dir}/channels/{uid}/", handle.path)
        return cls(tuple(handles), f.string("schema", max_length=1 << 20), f.integer("rows", default=0))


def operator_snapshots(f: Fields, key: str, scope: HandleScope) -> dict[str, OperatorSnapshot]:
    """The ``operators`` map of a document (uid → snapshot), handles checked against ``scope``."""
    raw = f.mapping(key, lambda value, name: value)
    return {
        uid: OperatorSnapshot.from_dict(v, f.document, f"{f.name(key)}.{uid}", scope, uid) for uid, v in raw.items()
    }


def is_own(handle: StateHandle, attempt_dir: str) -> bool:
    """Whether the step attempt writing to ``attempt_dir`` wrote ``handle`` itself."""
    return handle.path.startswith(f"{attempt_dir}/")


def stray_handles(snapshot: OperatorSnapshot, attempt_dir: str, restored: OperatorSnapshot | None) -> list[StateHandle]:
    """The rule for the state files a step lists: each is its own (:func:`is_own`) or kept from
    ``restored``, its restore point's snapshot of the same operator. Returns those that are neither."""
    kept = set(restored.handles) if restored is not None else set()
    return [h for h in snapshot.handles if not is_own(h, attempt_dir) and h not in kept]
