"""Values exchanged by the checkpoint protocol: plan, ack, state handles, completed checkpoint.

Every value converts to and from plain JSON types (``to_dict`` / ``from_dict``) because
it travels through XCom and lands in ``_metadata``. Paths inside handles are relative
to the job directory, so a snapshot can be relocated without rewriting them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

JsonDict = dict[str, Any]


class CheckpointType(enum.StrEnum):
    """What a checkpoint attempt is for."""

    CHECKPOINT = "checkpoint"
    SAVEPOINT = "savepoint"


@dataclass(frozen=True)
class StateHandle:
    """One state file: where it is (relative to the job directory), how big, its SHA-256.

    ``key_groups`` is the inclusive key-group range the file holds, when it holds keyed
    state; rescaling reads files by key group, never by the Spark partition that wrote them.
    """

    path: str
    size: int
    checksum: str
    key_groups: tuple[int, int] | None = None

    def to_dict(self) -> JsonDict:
        d: JsonDict = {"path": self.path, "size": self.size, "checksum": self.checksum}
        if self.key_groups is not None:
            d["key_groups"] = list(self.key_groups)
        return d

    @classmethod
    def from_dict(cls, d: JsonDict) -> StateHandle:
        kg = d.get("key_groups")
        return cls(
            path=str(d["path"]),
            size=int(d["size"]),
            checksum=str(d["checksum"]),
            key_groups=(int(kg[0]), int(kg[1])) if kg is not None else None,
        )


@dataclass(frozen=True)
class OperatorSnapshot:
    """The keyed state of one operator (by ``uid``) in one checkpoint.

    ``schema`` is the Spark JSON schema of the state rows, ``keys`` the key columns and
    ``max_parallelism`` the number of key groups the keys are hashed into.
    """

    handles: tuple[StateHandle, ...]
    schema: str
    keys: tuple[str, ...]
    max_parallelism: int
    rows: int = 0

    @property
    def size(self) -> int:
        return sum(h.size for h in self.handles)

    def to_dict(self) -> JsonDict:
        return {
            "handles": [h.to_dict() for h in self.handles],
            "schema": self.schema,
            "keys": list(self.keys),
            "max_parallelism": self.max_parallelism,
            "rows": self.rows,
        }

    @classmethod
    def from_dict(cls, d: JsonDict) -> OperatorSnapshot:
        return cls(
            handles=tuple(StateHandle.from_dict(h) for h in d["handles"]),
            schema=str(d["schema"]),
            keys=tuple(d["keys"]),
            max_parallelism=int(d["max_parallelism"]),
            rows=int(d.get("rows", 0)),
        )


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
    def from_dict(cls, d: JsonDict) -> Barrier:
        return cls(
            checkpoint_id=int(d["checkpoint_id"]),
            trigger_time=float(d["trigger_time"]),
            type=CheckpointType(d["type"]),
            positions=dict(d["positions"]),
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
    def from_dict(cls, d: JsonDict) -> RestorePoint:
        return cls(
            checkpoint_id=int(d["checkpoint_id"]),
            location_url=str(d["location_url"]),
            base_url=d.get("base_url"),
            source_positions=dict(d["source_positions"]),
            operators={uid: OperatorSnapshot.from_dict(s) for uid, s in d["operators"].items()},
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
    def from_dict(cls, d: JsonDict) -> CheckpointPlan:
        rp = d.get("restore_point")
        return cls(
            job_id=str(d["job_id"]),
            run_id=str(d["run_id"]),
            barrier=Barrier.from_dict(d["barrier"]),
            steps=tuple(d["steps"]),
            timeout_seconds=float(d["timeout_seconds"]),
            restore_point=RestorePoint.from_dict(rp) if rp else None,
            options=dict(d.get("options", {})),
        )


@dataclass(frozen=True)
class Ack:
    """A step's acknowledgement of one checkpoint attempt.

    ``sinks`` maps a sink uid to its committables (sink-defined JSON), staged by the
    step and committed by finalize. ``files`` lists every file the attempt wrote under
    the job directory, so a discarded ack can be cleaned up exactly.
    """

    job_id: str
    checkpoint_id: int
    step: str
    attempt: int
    operators: dict[str, OperatorSnapshot] = field(default_factory=dict)
    sinks: dict[str, list[JsonDict]] = field(default_factory=dict)
    metrics: JsonDict = field(default_factory=dict)
    attempt_dir: str = ""

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
        }

    @classmethod
    def from_dict(cls, d: JsonDict) -> Ack:
        return cls(
            job_id=str(d["job_id"]),
            checkpoint_id=int(d["checkpoint_id"]),
            step=str(d["step"]),
            attempt=int(d["attempt"]),
            operators={uid: OperatorSnapshot.from_dict(s) for uid, s in d["operators"].items()},
            sinks={uid: list(c) for uid, c in d.get("sinks", {}).items()},
            metrics=dict(d.get("metrics", {})),
            attempt_dir=str(d.get("attempt_dir", "")),
        )


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
