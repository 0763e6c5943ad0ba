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

from airflow_provider_checkpoint.core.event_time import duration_ms
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

EVENT_TIME, PROCESSING_TIME = "event_time", "processing_time"
MAX_FIRINGS = 10_000
"""Timer calls per key and checkpoint above which a function that keeps registering due timers is stopped."""
_INTS = {"tinyint", "byte", "smallint", "short", "int", "integer", "bigint", "long"}
_FLOATS = {"float", "real", "double"}
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
TYPES = frozenset({*_INTS, *_FLOATS, "boolean", "string", "timestamp", "json"})
"""The types a state value (or a map key, ``json`` aside) may be declared with."""


@dataclass(frozen=True)
class TTL:
    """State time-to-live: ``TTL("1 hour")`` (processing time, refreshed on write),
    ``TTL("1 day", time="event_time", update="on_read_and_write")``."""

    duration: str
    time: str = PROCESSING_TIME
    update: str = "on_write"

    def ms(self, what: str) -> int:
        """The duration in ms, the declaration checked (``what`` names it in errors)."""
        if self.time not in (EVENT_TIME, PROCESSING_TIME):
            raise PipelineDefinitionError(
                f"{what}: ttl time must be 'event_time' or 'processing_time', got {self.time!r}"
            )
        if self.update not in ("on_write", "on_read_and_write"):
            raise PipelineDefinitionError(
                f"{what}: ttl update must be 'on_write' or 'on_read_and_write', got {self.update!r}"
            )
        ms = duration_ms(self.duration, f"{what} ttl")
        if ms <= 0:
            raise PipelineDefinitionError(f"{what}: ttl must be positive")
        return ms


@dataclass(frozen=True)
class StateSpec:
    """A named state of a process function: ``kind`` value, list or map, its value type (and a map's key type)."""

    kind: ClassVar[str] = ""
    name: str
    type: str
    ttl: TTL | str | None = None
    key_type: str | None = None

    def ttl_spec(self) -> TTL | None:
        return TTL(self.ttl) if isinstance(self.ttl, str) else self.ttl


def ValueState(name: str, type: str, ttl: TTL | str | None = None) -> StateSpec:  # noqa: N802 - a declaration
    """One value per key (Spark's ``getValueState``, Flink's ``ValueStateDescriptor``)."""
    return _Value(name, type, ttl)


def ListState(name: str, type: str, ttl: TTL | str | None = None) -> StateSpec:  # noqa: N802
    """A list per key; with a TTL each element expires on its own."""
    return _List(name, type, ttl)


def MapState(name: str, key_type: str, type: str, ttl: TTL | str | None = None) -> StateSpec:  # noqa: N802
    """A map per key; with a TTL each entry expires on its own."""
    return _Map(name, type, ttl, key_type)


class _Value(StateSpec):
    kind = "value"


class _List(StateSpec):
    kind = "list"


class _Map(StateSpec):
    kind = "map"


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
    emit: ``None``, an iterable of dicts (by column) or tuples (in ``output_schema`` order), or a
    pandas DataFrame. They must be deterministic (a retried step calls them again)."""

    output_schema: ClassVar[str] = ""
    states: ClassVar[Sequence[StateSpec]] = ()

    def process(self, key: tuple[Any, ...], rows: Any, ctx: Context) -> Any:
        """The key's rows of this checkpoint (a pandas DataFrame, sorted by event time then by every column)."""
        raise NotImplementedError

    def on_timer(self, key: tuple[Any, ...], timer: Timer, ctx: Context) -> Any:
        """A timer of the key is due (see the module for when)."""
        raise NotImplementedError(f"{type(self).__name__} registers timers but has no on_timer")


def to_ms(value: Any, what: str) -> int:
    """A time as ms since the epoch: an int (ms) or a datetime (a naive one is UTC; a pandas Timestamp too)."""
    if isinstance(value, datetime.datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
        if hasattr(value, "value"):  # a pandas Timestamp: ns since the epoch
            return int(value.value // 1_000_000)
        return (aware - _EPOCH) // datetime.timedelta(milliseconds=1)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise TypeError(f"{what}: {value!r} is not a time; give a datetime or an int of ms since the epoch")


def _check(spec: StateSpec, type_: str, value: Any, where: str) -> Any:
    """``value`` as stored (JSON) for a declared type; a value of another type is refused."""
    if value is None:
        return None
    ok = {
        "boolean": isinstance(value, bool),
        "string": isinstance(value, str),
        "timestamp": isinstance(value, datetime.datetime),
    }.get(type_, True)
    if type_ in _INTS:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif type_ in _FLOATS:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok:
        raise TypeError(f"{where}: state {spec.name!r} is declared {type_}; {value!r} is a {type(value).__name__}")
    return to_ms(value, where) if type_ == "timestamp" else value


def _load(type_: str, stored: Any) -> Any:
    if type_ == "timestamp" and stored is not None:
        return datetime.datetime.fromtimestamp(stored / 1000, datetime.UTC)
    return stored


@dataclass
class Clocks:
    """The clocks of one checkpoint (ms): the watermark before it and the one it reaches (``None``: none
    yet), and its trigger time."""

    before: int | None
    after: int | None
    processing: int

    def of(self, time: str) -> int | None:
        return self.after if time == EVENT_TIME else self.processing


class KeyState:
    """One key's state: entries ``[value, expiry]`` by state name (a list: a list of them; a map:
    ``[key, value, expiry]``), and its timers."""

    def __init__(self, doc: Mapping[str, Any] | None = None) -> None:
        doc = doc or {}
        self.entries: dict[str, Any] = dict(doc.get("s", {}))
        self.timers: set[tuple[int, str]] = {(int(t), k) for t, k in doc.get("t", [])}

    @classmethod
    def loads(cls, text: str | None) -> KeyState:
        return cls(json.loads(text) if text else None)

    def dumps(self) -> str | None:
        """The document (keys sorted: the same state gives the same text), ``None`` when empty."""
        entries = {k: v for k, v in self.entries.items() if v not in (None, [])}
        if not entries and not self.timers:
            return None
        return json.dumps({"s": entries, "t": sorted(self.timers)}, sort_keys=True, separators=(",", ":"))

    def purge(self, specs: Mapping[str, StateSpec], clocks: Clocks) -> None:
        """Drop every expired entry (and the entries of states no longer declared)."""
        for name in list(self.entries):
            spec = specs.get(name)
            if spec is None:
                del self.entries[name]
                continue
            ttl = spec.ttl_spec()
            now = clocks.of(ttl.time) if ttl else None
            if now is None:
                continue
            if spec.kind == "value":
                if self.entries[name] is not None and _expired(self.entries[name][-1], now):
                    del self.entries[name]
            else:
                self.entries[name] = [e for e in self.entries[name] if not _expired(e[-1], now)]

    def wake(self, specs: Mapping[str, StateSpec]) -> tuple[int | None, int | None]:
        """The earliest time by event time and by processing time at which this key needs a visit
        with no rows: a timer or an expiry."""
        times: dict[str, list[int]] = {EVENT_TIME: [], PROCESSING_TIME: []}
        for ts, kind in self.timers:
            times[kind].append(ts)
        for name, stored in self.entries.items():
            ttl = specs[name].ttl_spec()
            if ttl is None or stored is None:
                continue
            expiries = [stored[-1]] if specs[name].kind == "value" else [e[-1] for e in stored]
            times[ttl.time] += [e for e in expiries if e is not None]
        return min(times[EVENT_TIME], default=None), min(times[PROCESSING_TIME], default=None)


def _expired(expiry: int | None, now: int) -> bool:
    return expiry is not None and expiry <= now


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
        now = self._clocks.of(ttl.time) if ttl else None
        return None if ttl is None or now is None else now + ttl.ms(spec.name)

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
        return None if stored is None else _load(self._spec.type, stored[0])

    def update(self, value: Any) -> None:
        if value is None:
            return self.clear()
        self._ctx._write(
            self._spec, [_check(self._spec, self._spec.type, value, self._where), self._ctx._expiry(self._spec)]
        )


class ListHandle(_Handle):
    def get(self) -> list[Any]:
        return [_load(self._spec.type, e[0]) for e in self._ctx._read(self._spec) or []]

    def append(self, value: Any) -> None:
        self.extend([value])

    def extend(self, values: Iterable[Any]) -> None:
        kept = self._ctx._state.entries.get(self._spec.name) or []
        self._ctx._write(self._spec, kept + self._stored(values))

    def update(self, values: Iterable[Any]) -> None:
        self._ctx._write(self._spec, self._stored(values))

    def _stored(self, values: Iterable[Any]) -> list[list[Any]]:
        expiry = self._ctx._expiry(self._spec)
        return [[_check(self._spec, self._spec.type, v, self._where), expiry] for v in values]


class MapHandle(_Handle):
    def _entries(self) -> list[list[Any]]:
        return self._ctx._read(self._spec) or []

    def get(self, key: Any, default: Any = None) -> Any:
        stored = self._stored_key(key)
        return next((_load(self._spec.type, e[1]) for e in self._entries() if e[0] == stored), default)

    def contains(self, key: Any) -> bool:
        stored = self._stored_key(key)
        return any(e[0] == stored for e in self._entries())

    def put(self, key: Any, value: Any) -> None:
        stored = self._stored_key(key)
        entry = [stored, _check(self._spec, self._spec.type, value, self._where), self._ctx._expiry(self._spec)]
        kept = [e for e in self._ctx._state.entries.get(self._spec.name) or [] if e[0] != stored]
        self._ctx._write(self._spec, sorted([*kept, entry], key=lambda e: json.dumps(e[0])))

    def remove(self, key: Any) -> None:
        stored = self._stored_key(key)
        self._ctx._write(self._spec, [e for e in self._ctx._state.entries.get(self._spec.name) or [] if e[0] != stored])

    def items(self) -> list[tuple[Any, Any]]:
        key_type = self._spec.key_type or "string"
        return [(_load(key_type, e[0]), _load(self._spec.type, e[1])) for e in self._entries()]

    def keys(self) -> list[Any]:
        return [k for k, _ in self.items()]

    def _stored_key(self, key: Any) -> Any:
        if key is None:
            raise TypeError(f"{self._where}: a map key cannot be None")
        return _check(self._spec, self._spec.key_type or "string", key, self._where)


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
        ttl = spec.ttl_spec()
        if ttl is not None:
            ttl.ms(f"{uid}: state {spec.name!r}")
        specs[spec.name] = _normalized(spec)
    return specs


def _normalized(spec: StateSpec) -> StateSpec:
    return type(spec)(spec.name, spec.type.lower(), spec.ttl_spec(), spec.key_type.lower() if spec.key_type else None)


@dataclass(frozen=True)
class KeyResult:
    """What one key's checkpoint gave: its state document (``None``: none left), its next wake-up
    times (event time, processing time) and the rows emitted (tuples in output order)."""

    state: str | None
    wake: tuple[int | None, int | None]
    emitted: list[tuple[Any, ...]]
    fired: int


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
    state.purge(specs, clocks)
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
    state.purge(specs, clocks)
    return KeyResult(state.dumps(), state.wake(specs), emitted, fired)


def _due(timer: tuple[int, str], clocks: Clocks) -> bool:
    now = clocks.after if timer[1] == EVENT_TIME else clocks.processing
    return now is not None and timer[0] <= now


def _rows(where: str, columns: Sequence[str], result: Any) -> list[tuple[Any, ...]]:
    """The rows a call returned, as tuples in ``columns`` order."""
    if result is None:
        return []
    if hasattr(result, "itertuples"):  # a pandas DataFrame
        missing = [c for c in columns if c not in result.columns]
        if missing:
            raise ValueError(
                f"{where}: emitted rows lack output column(s) {missing}; emit every column of output_schema"
            )
        return list(result[list(columns)].itertuples(index=False, name=None))
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
