"""Documents exchanged by the checkpoint protocol: barrier, plan, ack, completed checkpoint, restore request.

Every value converts to and from plain JSON types (``to_dict`` / ``from_dict``) because
it travels through XCom and lands in ``_metadata``. The state handles they carry are in
``core/state_handles``.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_checkpoint.core.documents import (
    JOB_ID,
    STEP,
    Fields,
    JsonDict,
    enum_value,
    relative_path,
)
from airflow_provider_checkpoint.exceptions import REQUIRED
from airflow_provider_checkpoint.state.handles import (
    ChannelSnapshot,
    HandleScope,
    OperatorSnapshot,
    operator_snapshots,
)

__all__ = ["JsonDict"]
_REQUEST_ID = re.compile(r"^[0-9a-f]{32}$")


class CheckpointType(enum.StrEnum):
    """What a checkpoint attempt is for."""

    CHECKPOINT = "checkpoint"
    SAVEPOINT = "savepoint"


def sink_committables(f: Fields, key: str, default: Any = None) -> dict[str, list[JsonDict]]:
    """The ``sinks`` map (uid → committables): lists of JSON objects; their shape is the sink's to check."""

    def committables(value: Any, name: str) -> list[JsonDict]:
        items = Fields({"c": value}, f.document, name).items("c", max_length=100_000)
        for i, item in enumerate(items):
            Fields(item, f.document, f"{name}[{i}]")
        return items

    return f.mapping(key, committables, default=default if default is not None else REQUIRED)


def checkpoint_options(f: Fields, key: str) -> JsonDict:
    """Options of a checkpoint: the savepoint target (a URL confined at use), stop, restore request."""
    options = f.obj(key, default={})
    if "savepoint_target" in options.raw:
        options.text("savepoint_target")
    if "stop_after_savepoint" in options.raw:
        options.flag("stop_after_savepoint")
    if "restore_request_id" in options.raw:
        options.string("restore_request_id", _REQUEST_ID)
    return options.raw


@dataclass(frozen=True)
class Barrier:
    """The cut across all sources: for every source uid, its end position (exclusive).

    A checkpoint processes, per source, what lies between the position of the restore
    point and this barrier. Positions are source-defined JSON values.
    """

    checkpoint_id: int
    trigger_time: float
    type: CheckpointType
    positions: JsonDict

    def to_dict(self) -> JsonDict:
        return {
            "checkpoint_id": self.checkpoint_id,
            "trigger_time": self.trigger_time,
            "type": self.type.value,
            "positions": self.positions,
        }

    @classmethod
    def from_dict(cls, d: Any, document: str = "barrier", where: str = "") -> Barrier:
        f = Fields(d, document, where)
        return cls(
            checkpoint_id=f.integer("checkpoint_id", 1),
            trigger_time=f.timestamp("trigger_time"),
            type=enum_value(CheckpointType, f, "type"),
            positions=f.mapping("positions", lambda v, name: v),
        )


@dataclass(frozen=True)
class RestorePoint:
    """The completed checkpoint (or savepoint) a new checkpoint starts from.

    ``location_url`` is the snapshot's directory; its state handles are relative to
    ``base_url`` (the snapshot directory for a relocatable savepoint) or, when that is
    ``None``, to the job directory.
    """

    checkpoint_id: int
    location_url: str
    source_positions: JsonDict
    operators: dict[str, OperatorSnapshot]
    base_url: str | None = None

    def to_dict(self) -> JsonDict:
        return {
            "checkpoint_id": self.checkpoint_id,
            "location_url": self.location_url,
            "base_url": self.base_url,
            "source_positions": self.source_positions,
            "operators": {uid: s.to_dict() for uid, s in self.operators.items()},
        }

    @classmethod
    def from_dict(cls, d: Any, document: str = "restore point", where: str = "") -> RestorePoint:
        f = Fields(d, document, where)
        checkpoint_id = f.integer("checkpoint_id", 1)
        return cls(
            checkpoint_id=checkpoint_id,
            location_url=f.text("location_url"),
            base_url=f.text("base_url", default=None),
            source_positions=f.mapping("source_positions", lambda v, name: v),
            operators=operator_snapshots(f, "operators", HandleScope(checkpoint_id, relocatable=None)),
        )


@dataclass(frozen=True)
class CheckpointPlan:
    """What the trigger decided: pushed to XCom, read by every step and by finalize."""

    job_id: str
    run_id: str
    barrier: Barrier
    steps: tuple[str, ...]
    timeout_seconds: float
    restore_point: RestorePoint | None = None
    options: JsonDict = field(default_factory=dict)
    """``savepoint_target`` (URL of the savepoint directory to write) and ``stop_after_savepoint``."""

    @property
    def checkpoint_id(self) -> int:
        return self.barrier.checkpoint_id

    def to_dict(self) -> JsonDict:
        return {
            "job_id": self.job_id,
            "run_id": self.run_id,
            "barrier": self.barrier.to_dict(),
            "steps": list(self.steps),
            "timeout_seconds": self.timeout_seconds,
            "restore_point": self.restore_point.to_dict() if self.restore_point else None,
            "options": self.options,
        }

    @classmethod
    def from_dict(cls, d: Any, document: str = "checkpoint plan") -> CheckpointPlan:
        f = Fields(d, document)
        barrier = Barrier.from_dict(f.raw.get("barrier"), document, "barrier")
        restore_point = None
        if f.has("restore_point"):
            restore_point = RestorePoint.from_dict(f.raw["restore_point"], document, "restore_point")
            if restore_point.checkpoint_id >= barrier.checkpoint_id:
                raise f.error("restore_point.checkpoint_id", "must be older than the planned checkpoint")
        steps = f.each("steps", lambda v, name: Fields({"s": v}, document, name).string("s", STEP))
        return cls(
            job_id=f.string("job_id", JOB_ID),
            run_id=f.text("run_id", max_length=500),
            barrier=barrier,
            steps=tuple(steps),
            timeout_seconds=f.number("timeout_seconds", 0.001),
            restore_point=restore_point,
            options=checkpoint_options(f, "options"),
        )


@dataclass(frozen=True)
class Ack:
    """A step's acknowledgement of one checkpoint attempt.

    ``sinks`` maps a sink uid to its committables (sink-defined JSON), staged by the
    step and committed by finalize. ``channels`` are the channels this step produced for
    downstream steps; ``inputs`` names, per channel it read, the producer's attempt
    directory, so finalize can check that every step read the accepted upstream attempt.
    """

    job_id: str
    checkpoint_id: int
    step: str
    attempt: int
    operators: dict[str, OperatorSnapshot] = field(default_factory=dict)
    sinks: dict[str, list[JsonDict]] = field(default_factory=dict)
    metrics: JsonDict = field(default_factory=dict)
    attempt_dir: str = ""
    channels: dict[str, ChannelSnapshot] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> JsonDict:
        return {
            "job_id": self.job_id,
            "checkpoint_id": self.checkpoint_id,
            "step": self.step,
            "attempt": self.attempt,
            "operators": {uid: s.to_dict() for uid, s in self.operators.items()},
            "sinks": self.sinks,
            "metrics": self.metrics,
            "attempt_dir": self.attempt_dir,
            "channels": {uid: c.to_dict() for uid, c in self.channels.items()},
            "inputs": self.inputs,
        }

    @classmethod
    def from_dict(cls, d: Any, document: str = "ack") -> Ack:
        """An ack as received (XCom, or storage in submit mode): its files must lie in its attempt directory."""
        f = Fields(d, document)
        checkpoint_id = f.integer("checkpoint_id", 1)
        step = f.string("step", STEP)
        attempt = f.integer("attempt", 1, 100_000)
        attempt_dir = f"chk-{checkpoint_id}/{step}/attempt-{attempt}"
        if f.raw.get("attempt_dir") != attempt_dir:
            raise f.error("attempt_dir", f"must be {attempt_dir}", f.raw.get("attempt_dir"))
        return cls(
            job_id=f.string("job_id", JOB_ID),
            checkpoint_id=checkpoint_id,
            step=step,
            attempt=attempt,
            operators=operator_snapshots(f, "operators", HandleScope(checkpoint_id, attempt_dir=attempt_dir)),
            sinks=sink_committables(f, "sinks", default={}),
            metrics=f.data("metrics", default={}),
            attempt_dir=attempt_dir,
            channels={
                uid: ChannelSnapshot.from_dict(c, document, f"channels.{uid}", attempt_dir, uid)
                for uid, c in f.mapping("channels", lambda value, name: value, default={}).items()
            },
            inputs=f.mapping("inputs", lambda v, name: _attempt_dir(v, document, name, checkpoint_id), default={}),
        )


def _attempt_dir(value: Any, document: str, field: str, checkpoint_id: int) -> str:
    """An attempt directory of ``checkpoint_id``: ``chk-<id>/<step>/attempt-<n>``."""
    pattern = re.compile(rf"chk-{checkpoint_id}/[A-Za-z0-9_][A-Za-z0-9_.-]{{0,499}}/attempt-[1-9][0-9]{{0,5}}")
    return relative_path(value, document, field, pattern=pattern)


@dataclass(frozen=True)
class CompletedCheckpoint:
    """A checkpoint whose ``_metadata`` is written: the unit of recovery."""

    job_id: str
    checkpoint_id: int
    type: CheckpointType
    trigger_time: float
    completion_time: float
    restored_from: int | None
    barrier: Barrier
    operators: dict[str, OperatorSnapshot]
    sinks: dict[str, list[JsonDict]]
    stats: JsonDict = field(default_factory=dict)
    options: JsonDict = field(default_factory=dict)
    relocatable: bool = False
    """True for a savepoint: handle paths are relative to its own directory."""

    @property
    def source_positions(self) -> JsonDict:
        """Where the next checkpoint starts reading: this checkpoint's barrier."""
        return self.barrier.positions

    @property
    def state_size(self) -> int:
        return sum(s.size for s in self.operators.values())

    def referenced_paths(self) -> set[str]:
        """Every state file this checkpoint needs, relative to the job directory."""
        return {h.path for s in self.operators.values() for h in s.handles}

    def to_restore_point(self, location_url: str, base_url: str | None = None) -> RestorePoint:
        return RestorePoint(
            checkpoint_id=self.checkpoint_id,
            location_url=location_url,
            source_positions=self.source_positions,
            operators=self.operators,
            base_url=base_url,
        )


@dataclass(frozen=True)
class RestoreRequest:
    """``_restore.json``: the snapshot the next checkpoint of the job restores from.

    ``location_url`` is confined to the allowed roots again when the trigger uses it.
    """

    request_id: str
    location_url: str
    checkpoint_id: int
    allow_non_restored_state: bool
    requested_at: float

    def to_dict(self) -> JsonDict:
        return {
            "request_id": self.request_id,
            "location_url": self.location_url,
            "checkpoint_id": self.checkpoint_id,
            "allow_non_restored_state": self.allow_non_restored_state,
            "requested_at": self.requested_at,
        }

    @classmethod
    def from_dict(cls, d: Any, document: str = "_restore.json") -> RestoreRequest:
        f = Fields(d, document)
        return cls(
            request_id=f.string("request_id", _REQUEST_ID),
            location_url=f.text("location_url"),
            checkpoint_id=f.integer("checkpoint_id", 1),
            allow_non_restored_state=f.flag("allow_non_restored_state"),
            requested_at=f.timestamp("requested_at"),
        )
