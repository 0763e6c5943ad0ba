"""A per-key process function with state, timers and state TTL: what runs for one key in one checkpoint.

The user subclasses :class:`KeyedProcessFunction`. One checkpoint, for one key (:func:`run_key`):

1. entries of the key's state whose TTL has expired are dropped (never read back);
2. if the checkpoint holds rows of the key, :meth:`KeyedProcessFunction.process` is called once
   with all of them (``ctx.watermark``: the watermark before this checkpoint);
3. every due timer fires, one :meth:`KeyedProcessFunction.on_timer` call each, in order of
   timestamp (at one timestamp, the event-time timer first): an event-time timer is due when its
   timestamp is at most the watermark this checkpoint reaches, a processing-time timer when it is
   at most the checkpoint's trigger time. A timer registered while firing fires in the same
   checkpoint if it is due; ``ctx.watermark`` is the watermark reached;
4. what is left (state entries, timers) is the key's state after the checkpoint; none: the key is dropped.

Timers are a set per key of (kind, timestamp): registering one twice keeps one. TTL: an entry
written (or read, with ``update="on_read_and_write"``) expires ``ttl`` later by its clock, the
checkpoint's trigger time (processing time) or the watermark it reaches (event time); it is
expired when its expiry is at most that clock. Times are milliseconds since the epoch (UTC).
Everything is deterministic given the rows, the state and the two clocks, so a retried step gives
the same result. The state of a key is one JSON document (:meth:`KeyState.dumps`).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from airflow_provider_checkpoint.core.keyed_state import (
    EVENT_TIME,
    PROCESSING_TIME,
    TYPES,
    KeyState,
    ListState,
    MapState,
    StateSpec,
    ValueState,
    check_value,
    load_value,
    normalized,
    to_ms,
)
from airflow_provider_checkpoint.core.ttl import TTL, Clocks
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

__all__ = [
    "EVENT_TIME",
    "MAX_FIRINGS",
    "ROWS_FORMATS",
    "PROCESSING_TIME",
    "Clocks",
    "Context",
    "KeyState",
    "KeyedProcessFunction",
    "ListState",
    "MapState",
    "StateSpec",
    "Timer",
    "ValueState",
    "check_function",
    "run_key",
    "to_ms",
]

MAX_FIRINGS = 10_000
ROWS_FORMATS = ("pandas", "arrow")


@dataclass(frozen=True, order=True)
class Timer:
    """A timer that fires: its ``timestamp`` (ms) and ``kind`` (``event_time`` or ``processing_time``)."""

    timestamp: int
    kind: str

    @property
    def time(self) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.timestamp / 1000, datetime.UTC)


class KeyedProcessFunction:
    """Subclass it: ``output_schema`` (Spark DDL of the rows it emits), ``states`` (its declared
    state), :meth:`process` and, if it registers timers, :meth:`on_timer`. Both return the rows to
    emit: ``None``, an iterable of dicts (by column) or tuples (in ``output_schema`` order), a pandas
    DataFrame or a pyarrow Table. They must be deterministic (a retried step calls them again).

    ``rows_format``: ``"pandas"`` (the default) gives :meth:`process` a pandas DataFrame, ``"arrow"`` a
    pyarrow Table, which Spark hands over without a pandas conversion (faster: Spark's
    ``applyInArrow``); either way sorted by event time, then by every orderable column, nulls first,
    and timestamps are UTC."""

    output_schema: ClassVar[str] = ""
    states: ClassVar[Sequence[StateSpec]] = ()
    rows_format: ClassVar[str] = "pandas"

    def process(self, key: tuple[Any, ...], rows: Any, ctx: Context) -> Any:
        """The key's rows of this checkpoint (a pandas DataFrame or a pyarrow Table: ``rows_format``)."""
        raise NotImplementedError

    def on_timer(self, key: tuple[Any, ...], timer: Timer, ctx: Context) -> Any:
        """A timer of the key is due (see the module for when)."""
        raise NotImplementedError(f"{type(self).__name__} registers timers but has no on_timer")


class Context:
    """What :meth:`KeyedProcessFunction.process` and :meth:`~KeyedProcessFunction.on_timer` get: the
    key's state by name (:meth:`state`), its timers, ``watermark`` and ``processing_time`` (ms)."""

    def __init__(self, where: str, specs: Mapping[str, StateSpec], state: KeyState, clocks: Clocks) -> None:
        self._where, self._specs, self._state, self._clocks = where, specs, state, clocks
        self.watermark = clocks.before
        self.processing_time = clocks.processing

    def state(self, name: str) -> ValueHandle | ListHandle | MapHandle:
        spec = self._specs.get(name)
        if spec is None:
            raise KeyError(
                f"{self._where}: state {name!r} is not declared; add it to states "
                f"(declared: {', '.join(self._specs) or 'none'})"
            )
        if spec.kind == "value":
            return ValueHandle(self, spec)
        return ListHandle(self, spec) if spec.kind == "list" else MapHandle(self, spec)

    def register_event_time_timer(self, time: Any) -> None:
        self._state.timers.add((to_ms(time, f"{self._where}: event-time timer"), EVENT_TIME))

    def register_processing_time_timer(self, time: Any) -> None:
        self._state.timers.add((to_ms(time, f"{self._where}: processing-time timer"), PROCESSING_TIME))

    def delete_event_time_timer(self, time: Any) -> None:
        self._state.timers.discard((to_ms(time, f"{self._where}: event-time timer"), EVENT_TIME))

    def delete_processing_time_timer(self, time: Any) -> None:
        self._state.timers.discard((to_ms(time, f"{self._where}: processing-time timer"), PROCESSING_TIME))

    def timers(self) -> list[Timer]:
        """The key's registered timers, in firing order."""
        return sorted(Timer(ts, kind) for ts, kind in self._state.timers)

    def _expiry(self, spec: StateSpec) -> int | None:
        ttl = spec.ttl_spec()
        now = self._clocks.keep(ttl.time) if ttl else None
        return None if ttl is None or now is None else now + ttl.ms

    def _read(self, spec: StateSpec) -> Any:
        stored = self._state.entries.get(spec.name)
        ttl = spec.ttl_spec()
        if stored is not None and ttl is not None and ttl.update == "on_read_and_write":
            expiry = self._expiry(spec)
            if spec.kind == "value":
                stored[-1] = expiry
            else:
                for e in stored:
                    e[-1] = expiry
        return stored

    def _write(self, spec: StateSpec, stored: Any) -> None:
        self._state.entries[spec.name] = stored


class _Handle:
    def __init__(self, ctx: Context, spec: StateSpec) -> None:
        self._ctx, self._spec = ctx, spec
        self._where = f"{ctx._where}: state {spec.name!r}"

    def clear(self) -> None:
        self._ctx._state.entries.pop(self._spec.name, None)

    def exists(self) -> bool:
        return bool(self._ctx._read(self._spec))


class ValueHandle(_Handle):
    def get(self) -> Any:
        stored = self._ctx._read(self._spec)
        return None if stored is None else load_value(self._spec.type, stored[0])

    def update(self, value: Any) -> None:
        if value is None:
            return self.clear()
        self._ctx._write(
            self._spec, [check_value(self._spec, self._spec.type, value, self._where), self._ctx._expiry(self._spec)]
        )


class ListHandle(_Handle):
    def get(self) -> list[Any]:
        return [load_value(self._spec.type, e[0]) for e in self._ctx._read(self._spec) or []]

    def append(self, value: Any) -> None:
        self.extend([value])

    def extend(self, values: Iterable[Any]) -> None:
        kept = self._ctx._state.entries.get(self._spec.name) or []
        self._ctx._write(self._spec, kept + self._stored(values))

    def update(self, values: Iterable[Any]) -> None:
        self._ctx._write(self._spec, self._stored(values))

    def _stored(self, values: Iterable[Any]) -> list[list[Any]]:
        expiry = self._ctx._expiry(self._spec)
        return [[check_value(self._spec, self._spec.type, v, self._where), expiry] for v in values]


class MapHandle(_Handle):
    def _entries(self) -> list[list[Any]]:
        return self._ctx._read(self._spec) or []

    def get(self, key: Any, default: Any = None) -> Any:
        stored = self._stored_key(key)
        return next((load_value(self._spec.type, e[1]) for e in self._entries() if e[0] == stored), default)

    def contains(self, key: Any) -> bool:
        stored = self._stored_key(key)
        return any(e[0] == stored for e in self._entries())

    def put(self, key: Any, value: Any) -> None:
        stored = self._stored_key(key)
        entry = [stored, check_value(self._spec, self._spec.type, value, self._where), self._ctx._expiry(self._spec)]
        kept = [e for e in self._ctx._state.entries.get(self._spec.name) or [] if e[0] != stored]
        self._ctx._write(self._spec, sorted([*kept, entry], key=lambda e: json.dumps(e[0])))

    def remove(self, key: Any) -> None:
        stored = self._stored_key(key)
        self._ctx._write(self._spec, [e for e in self._ctx._state.entries.get(self._spec.name) or [] if e[0] != stored])

    def items(self) -> list[tuple[Any, Any]]:
        key_type = self._spec.key_type or "string"
        return [(load_value(key_type, e[0]), load_value(self._spec.type, e[1])) for e in self._entries()]

    def keys(self) -> list[Any]:
        return [k for k, _ in self.items()]

    def _stored_key(self, key: Any) -> Any:
        if key is None:
            raise TypeError(f"{self._where}: a map key cannot be None")
        return check_value(self._spec, self._spec.key_type or "string", key, self._where)


def check_function(uid: str, fn: Any) -> dict[str, StateSpec]:
    """The declared states of ``fn`` by name; a definition that cannot run is refused, naming ``uid`` and the fix."""
    if isinstance(fn, type) and issubclass(fn, KeyedProcessFunction):
        raise PipelineDefinitionError(
            f"{uid}: function must be an instance; write {fn.__name__}() instead of {fn.__name__}"
        )
    if not isinstance(fn, KeyedProcessFunction):
        raise PipelineDefinitionError(f"{uid}: function must be an instance of a KeyedProcessFunction subclass")
    name = type(fn).__name__
    if type(fn).process is KeyedProcessFunction.process:
        raise PipelineDefinitionError(f"{uid}: {name} must define process(self, key, rows, ctx)")
    if not isinstance(fn.output_schema, str) or not fn.output_schema.strip():
        raise PipelineDefinitionError(
            f"{uid}: {name} has no output_schema; declare the rows it emits, "
            "e.g. output_schema = 'user STRING, at TIMESTAMP'"
        )
    if fn.rows_format not in ROWS_FORMATS:
        raise PipelineDefinitionError(
            f"{uid}: {name}.rows_format {fn.rows_format!r} is not one of {', '.join(map(repr, ROWS_FORMATS))}"
        )
    specs: dict[str, StateSpec] = {}
    for spec in fn.states:
        if not isinstance(spec, StateSpec):
            raise PipelineDefinitionError(
                f"{uid}: {name}.states must hold ValueState/ListState/MapState declarations, got {spec!r}"
            )
        if spec.name in specs or not spec.name:
            raise PipelineDefinitionError(f"{uid}: {name} declares state {spec.name!r} twice (or with no name)")
        for what, type_ in (("type", spec.type), ("key_type", spec.key_type)):
            if type_ is None and what == "key_type":
                continue
            if not isinstance(type_, str) or type_.lower() not in TYPES or (what == "key_type" and type_ == "json"):
                raise PipelineDefinitionError(
                    f"{uid}: state {spec.name!r}: {what} {type_!r} is not supported; "
                    f"use one of {', '.join(sorted(TYPES))}"
                    + (" (not json for a map key)" if what == "key_type" else "")
                )
        if spec.ttl is not None:
            TTL.of(spec.ttl, f"{uid}: state {spec.name!r}")
        specs[spec.name] = normalized(spec)
    return specs


@dataclass(frozen=True)
class KeyResult:
    """What one key's checkpoint gave: its state document (``None``: none left), its next wake-up
    times (event time, processing time), the rows emitted (tuples in output order), the timers that
    fired and the state entries that expired."""

    state: str | None
    wake: tuple[int | None, int | None]
    emitted: list[tuple[Any, ...]]
    fired: int
    expired: int


def run_key(
    uid: str,
    fn: KeyedProcessFunction,
    specs: Mapping[str, StateSpec],
    columns: Sequence[str],
    key: tuple[Any, ...],
    rows: Any,
    stored: str | None,
    clocks: Clocks,
) -> KeyResult:
    """One checkpoint of one key, in the order the module states; ``rows`` ``None``: the key has none."""
    where = f"{uid} (key {key!r})"
    state = KeyState.loads(stored)
    expired = state.purge(specs, clocks)
    ctx = Context(where, specs, state, clocks)
    emitted: list[tuple[Any, ...]] = []
    if rows is not None:
        emitted += _rows(where, columns, fn.process(key, rows, ctx))
    ctx.watermark = clocks.after
    fired = 0
    while due := [t for t in state.timers if _due(t, clocks)]:
        ts, kind = min(due, key=lambda t: (t[0], t[1] != EVENT_TIME))
        state.timers.discard((ts, kind))
        fired += 1
        if fired > MAX_FIRINGS:
            raise RuntimeError(
                f"{where}: more than {MAX_FIRINGS} timers fired in one checkpoint; on_timer keeps registering "
                "timers that are already due — register the next one later than the current time"
            )
        emitted += _rows(where, columns, fn.on_timer(key, Timer(ts, kind), ctx))
    expired += state.purge(specs, clocks)
    return KeyResult(state.dumps(), state.wake(specs), emitted, fired, expired)


def _due(timer: tuple[int, str], clocks: Clocks) -> bool:
    now = clocks.after if timer[1] == EVENT_TIME else clocks.processing
    return now is not None and timer[0] <= now


def _rows(where: str, columns: Sequence[str], result: Any) -> list[tuple[Any, ...]]:
    """The rows a call returned, as tuples in ``columns`` order."""
    if result is None:
        return []
    tabular = hasattr(result, "itertuples") or hasattr(result, "column_names")  # pandas DataFrame, pyarrow Table
    if tabular:
        have = result.column_names if hasattr(result, "column_names") else result.columns
        missing = [c for c in columns if c not in have]
        if missing:
            raise ValueError(
                f"{where}: emitted rows lack output column(s) {missing}; emit every column of output_schema"
            )
        if hasattr(result, "itertuples"):
            return list(result[list(columns)].itertuples(index=False, name=None))
        return list(zip(*(result.column(c).to_pylist() for c in columns), strict=True))
    rows = []
    for row in result:
        if isinstance(row, Mapping):
            extra = set(row) - set(columns)
            if extra:
                raise ValueError(
                    f"{where}: emitted column(s) {sorted(extra)} not in output_schema ({', '.join(columns)})"
                )
            rows.append(tuple(row.get(c) for c in columns))
        elif isinstance(row, tuple | list) and len(row) == len(columns):
            rows.append(tuple(row))
        else:
            raise ValueError(f"{where}: an emitted row must be a dict or a tuple of {len(columns)} values, got {row!r}")
    return rows
