"""Validation at the boundary: every stored or passed-on document is untrusted input.

``_metadata``, plans, acks, restore requests, job records and table logs may have been
written by someone else (a savepoint copied in, a hand-edited file, a forged XCom).
Decoders read them through :class:`Fields`, which checks type, range and shape of every
value and raises :class:`DocumentError` naming the document, the field and the value.
Paths are checked by :func:`relative_path`: relative, normalized, no ``..``, no scheme,
no control characters or backslashes, and made only of characters our writers use.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any, TypeVar

from airflow_provider_checkpoint.exceptions import MAX_TIMESTAMP, REQUIRED, DocumentError

T = TypeVar("T")
JsonDict = dict[str, Any]

MAX_ID = 2**63 - 1
"""Checkpoint ids, sizes and counts fit a signed 64-bit integer (as in Flink)."""
JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,249}$")
UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
STEP = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,499}$")
CHECKSUM = re.compile(r"^sha256:[0-9a-f]{64}$")
_SEGMENT = re.compile(r"^(?!\.{1,2}$)[A-Za-z0-9_.=+-]{1,255}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def load_json(data: bytes | str, document: str) -> Any:
    """Parse a JSON document; malformed, too deep or too large input is a :class:`DocumentError`."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError, UnicodeDecodeError) as e:
        raise DocumentError(document, "", f"is not valid JSON ({str(e)[:200]})") from None


def path_problem(value: str, strict: bool = True) -> str | None:
    """Why ``value`` is not a safe relative path, or ``None`` if it is.

    ``strict`` also limits every segment to the characters our own writers use
    (letters, digits, ``_ . = + -``); otherwise any name without control characters.
    """
    if not value:
        return "is empty"
    if len(value) > 4096:
        return "is too long"
    if _CONTROL.search(value):
        return "contains a control character"
    if "\\" in value:
        return "contains a backslash"
    if value.startswith("/"):
        return "is absolute"
    if _SCHEME.match(value):
        return "has a scheme"
    segments = value.split("/")
    if any(s in ("", ".", "..") for s in segments):
        return "is not normalized (empty, '.' or '..' segment)"
    if strict and not all(_SEGMENT.match(s) for s in segments):
        return "contains characters outside [A-Za-z0-9_.=+-/]"
    return None


def relative_path(
    value: Any, document: str, field: str, under: str | None = None, pattern: re.Pattern[str] | None = None
) -> str:
    """``value`` as a safe relative path (see :func:`path_problem`), optionally ``under`` a prefix.

    ``pattern``, when given, must match the whole path: the shape its owner writes.
    """
    if not isinstance(value, str):
        raise DocumentError(document, field, "must be a path string", value)
    problem = path_problem(value)
    if problem:
        raise DocumentError(document, field, f"is not a safe relative path: it {problem}", value)
    if under is not None and not value.startswith(under.rstrip("/") + "/"):
        raise DocumentError(document, field, f"must lie under {under}/", value)
    if pattern is not None and not pattern.fullmatch(value):
        raise DocumentError(document, field, f"does not have the expected shape {pattern.pattern}", value)
    return value


class Fields:
    """Typed, bounded access to one JSON object of a document; errors name document and field."""

    def __init__(self, value: Any, document: str, where: str = "") -> None:
        if not isinstance(value, dict):
            raise DocumentError(document, where, "must be a JSON object", value)
        self.raw: JsonDict = value
        self.document = document
        self.where = where

    def name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def error(self, key: str, problem: str, value: Any = REQUIRED) -> DocumentError:
        return DocumentError(self.document, self.name(key), problem, value)

    def _get(self, key: str, default: Any) -> Any:
        if key in self.raw:
            return self.raw[key]
        if default is REQUIRED:
            raise self.error(key, "is missing")
        return default

    def has(self, key: str) -> bool:
        return self.raw.get(key) is not None

    def integer(self, key: str, minimum: int = 0, maximum: int = MAX_ID, default: Any = REQUIRED) -> Any:
        value = self._get(key, default)
        if value is default and default is not REQUIRED:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
            raise self.error(key, f"must be an integer in [{minimum}, {maximum}]", value)
        return value

    def number(self, key: str, minimum: float = 0.0, default: Any = REQUIRED, maximum: float = 1e15) -> Any:
        value = self._get(key, default)
        if value is default and default is not REQUIRED:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(key, "must be a number", value)
        if not math.isfinite(value) or value < minimum or value > maximum:
            raise self.error(key, f"must be a finite number in [{minimum}, {maximum:g}]", value)
        return float(value)

    def timestamp(self, key: str, default: Any = REQUIRED) -> Any:
        """Seconds since the epoch that a datetime can hold (up to the end of year 9999 UTC)."""
        return self.number(key, default=default, maximum=MAX_TIMESTAMP)

    def flag(self, key: str, default: Any = REQUIRED) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise self.error(key, "must be true or false", value)
        return value

    def string(
        self, key: str, pattern: re.Pattern[str] | None = None, max_length: int = 4096, default: Any = REQUIRED
    ) -> Any:
        value = self._get(key, default)
        if value is default and default is not REQUIRED:
            return default
        if not isinstance(value, str) or len(value) > max_length:
            raise self.error(key, f"must be a string of at most {max_length} characters", value)
        if pattern is not None and not pattern.fullmatch(value):
            raise self.error(key, f"must match {pattern.pattern}", value)
        return value

    def text(self, key: str, max_length: int = 4096, default: Any = REQUIRED) -> Any:
        """A string without control characters (names shown to people, run ids)."""
        value = self.string(key, max_length=max_length, default=default)
        if isinstance(value, str) and _CONTROL.search(value):
            raise self.error(key, "contains a control character", value)
        return value

    def path(
        self, key: str, under: str | None = None, pattern: re.Pattern[str] | None = None, default: Any = REQUIRED
    ) -> Any:
        value = self._get(key, default)
        if value is default and default is not REQUIRED:
            return default
        return relative_path(value, self.document, self.name(key), under, pattern)

    def obj(self, key: str, default: Any = REQUIRED) -> Fields:
        value = self._get(key, default)
        return Fields(value, self.document, self.name(key))

    def data(self, key: str, default: Any = REQUIRED) -> JsonDict:
        """A JSON object kept as data (stats, positions): only its type is checked here."""
        return self.obj(key, default).raw

    def items(self, key: str, default: Any = REQUIRED, max_length: int = 1_000_000) -> list[Any]:
        value = self._get(key, default)
        if not isinstance(value, list) or len(value) > max_length:
            raise self.error(key, f"must be a list of at most {max_length} items", value)
        return value

    def each(self, key: str, read: Callable[[Any, str], T], default: Any = REQUIRED) -> list[T]:
        """``read(item, field_name)`` for every item of the list ``key``."""
        return [read(item, f"{self.name(key)}[{i}]") for i, item in enumerate(self.items(key, default))]

    def mapping(
        self, key: str, read: Callable[[Any, str], T], keys: re.Pattern[str] = UID, default: Any = REQUIRED
    ) -> dict[str, T]:
        """``read(value, field_name)`` for every entry of the object ``key``; keys must match ``keys``."""
        raw = self.obj(key, default).raw
        out = {}
        for k, v in raw.items():
            if not keys.fullmatch(k):
                raise self.error(key, f"has a key that does not match {keys.pattern}", k)
            out[k] = read(v, f"{self.name(key)}.{k}")
        return out


def enum_value(factory: Callable[[Any], T], fields: Fields, key: str, default: Any = REQUIRED) -> T:
    """``factory(value)`` (an enum), with a :class:`DocumentError` for unknown values."""
    value = fields._get(key, default)
    try:
        return factory(value)
    except (ValueError, TypeError):
        raise fields.error(key, "is not a known value", value) from None
