"""The state of a per-key process function: declarations (value, list, map; types; TTL), one key's
state document with its expiries and timers, and the clocks of a checkpoint.

A key's state is one JSON document (:meth:`KeyState.dumps`): entries ``[value, expiry]`` by state
name (a list state: a list of them; a map state: ``[key, value, expiry]``, sorted by key) and its
timers ``[timestamp, kind]``. An expiry is in milliseconds by the state's TTL clock (``None``: no
TTL); an entry is expired once its expiry is at most that clock (:class:`Clocks`).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from airflow_provider_checkpoint.core.ttl import TTL, Clocks, live

EVENT_TIME, PROCESSING_TIME = "event_time", "processing_time"
"""The kinds of timers (``Timer.kind``)."""
_INTS = {"tinyint", "byte", "smallint", "short", "int", "integer", "bigint", "long"}
_FLOATS = {"float", "real", "double"}
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
TYPES = frozenset({*_INTS, *_FLOATS, "boolean", "string", "timestamp", "json"})
"""The types a state value (or a map key, ``json`` aside) may be declared with."""


@dataclass(frozen=True)
class StateSpec:
    """A named state of a process function: ``kind`` value, list or map, its value type (and a map's key type)."""

    kind: ClassVar[str] = ""
    name: str
    type: str
    ttl: TTL | str | None = None
    key_type: str | None = None

    def ttl_spec(self) -> TTL | None:
        """The declared :class:`~.core.ttl.TTL` (a duration string: ``TTL(duration)``)."""
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


def check_value(spec: StateSpec, type_: str, value: Any, where: str) -> Any:
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


def load_value(type_: str, stored: Any) -> Any:
    if type_ == "timestamp" and stored is not None:
        return datetime.datetime.fromtimestamp(stored / 1000, datetime.UTC)
    return stored


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

    def purge(self, specs: Mapping[str, StateSpec], clocks: Clocks) -> int:
        """Drop every expired entry (and the entries of states no longer declared); how many expired (a
        value: one, a list or a map: each element)."""
        expired = 0
        for name in list(self.entries):
            spec = specs.get(name)
            if spec is None:
                del self.entries[name]
                continue
            ttl = spec.ttl_spec()
            now = clocks.keep(ttl.time) if ttl else None
            if now is None:
                continue
            if spec.kind == "value":
                if self.entries[name] is not None and not live(self.entries[name][-1], now):
                    del self.entries[name]
                    expired += 1
            else:
                kept = [e for e in self.entries[name] if live(e[-1], now)]
                expired += len(self.entries[name]) - len(kept)
                self.entries[name] = kept
        return expired

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
            times[EVENT_TIME if ttl.time == "event" else PROCESSING_TIME] += [e for e in expiries if e is not None]
        return min(times[EVENT_TIME], default=None), min(times[PROCESSING_TIME], default=None)


def stored_type(type_: str) -> str:
    """How a value of declared type ``type_`` is stored: the integer types alike, the floating ones alike."""
    return "integer" if type_ in _INTS else "float" if type_ in _FLOATS else type_


def declaration(spec: StateSpec) -> str:
    """What ``spec``'s stored entries mean: its kind, stored types and TTL clock, as a short text."""
    types = (
        stored_type(spec.type) if spec.key_type is None else f"{stored_type(spec.key_type)} -> {stored_type(spec.type)}"
    )
    ttl = spec.ttl_spec()
    return f"{spec.kind} of {types}, ttl " + (f"by {ttl.time} time" if ttl else "none")


def normalized(spec: StateSpec) -> StateSpec:
    return type(spec)(spec.name, spec.type.lower(), spec.ttl_spec(), spec.key_type.lower() if spec.key_type else None)
