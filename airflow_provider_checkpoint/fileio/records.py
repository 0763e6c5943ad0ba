"""JSON Lines and CSV records parsed in Python the way Spark's permissive readers parse them.

Used by the Python file reader (:mod:`.writes`) where Hadoop cannot open the landing
directory's scheme. One record per line (Spark's default, ``multiLine=false``); blank
lines are skipped; a CSV file's first line is its header unless ``header`` is ``false``.
A record that is not parseable or whose value does not convert to its column's type is
malformed: :data:`~.malformed.CORRUPT` holds its raw text, and the fields that convert keep their
values, the others null, as Spark's readers keep them (every column null if it does not parse).
Values convert as Spark's do for the simple types (string, integers, floating point,
boolean, decimal, date, timestamp); other column types are refused up front.
"""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import json
import re
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

if TYPE_CHECKING:
    import pyarrow as pa

CSV_OPTIONS = frozenset({"header", "sep", "delimiter", "quote", "escape"})
"""CSV options the Python reader honours; any other is refused (a Hadoop filesystem reads them all)."""
_INTEGER = re.compile(r"^[+-]?\d+$")
_TRUE, _FALSE = frozenset({"true"}), frozenset({"false"})
_DATE = re.compile(r"^\+?(\d{4,7})(?:-(\d{1,2})(?:-(\d{1,2})(?:[ T].*)?)?)?$", re.DOTALL)
"""A date as Spark's readers parse one without ``dateFormat``: ``yyyy``, ``yyyy-[m]m``, ``yyyy-[m]m-[d]d``, the
last followed by anything after a space or ``T``."""
_NON_NUMERIC = {"NaN": float("nan"), "Infinity": float("inf"), "+Infinity": float("inf"), "+INF": float("inf")}
_NON_NUMERIC |= {"-Infinity": float("-inf"), "-INF": float("-inf")}
"""The JSON strings Spark's reader takes as floating-point values (``allowNonNumericNumbers``)."""


class Malformed(ValueError):
    """A value that does not convert to its column's type."""


Converter = Callable[[Any], Any]


def converters(schema: pa.Schema, text: bool) -> list[Converter]:
    """One converter per field of ``schema``: from a JSON value, or from CSV text with ``text``."""
    return [_converter(field.type, text, field.name) for field in schema]


def _converter(kind: pa.DataType, text: bool, name: str) -> Converter:
    import pyarrow as pa

    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return _string_from_text if text else _string_from_json
    if pa.types.is_integer(kind):
        bits = kind.bit_width
        return lambda v: _integer(v, text, bits)
    if pa.types.is_floating(kind):
        return lambda v: _floating(v, text)
    if pa.types.is_boolean(kind):
        return lambda v: _boolean(v, text)
    if pa.types.is_decimal(kind):
        return lambda v: _decimal(v, kind.precision, kind.scale)
    if pa.types.is_date(kind):
        return lambda v: _parsed(v, _date)
    if pa.types.is_timestamp(kind):
        return lambda v: _timestamp(v, text)
    raise PipelineDefinitionError(
        f"column {name!r} of type {kind} cannot be read by the Python file reader (simple types only); "
        "configure a Hadoop filesystem for the landing directory's scheme (docs/execution-modes.md)"
    )


def _string_from_text(value: str) -> str:
    return value


def _string_from_json(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _integer(value: Any, text: bool, bits: int) -> int:
    if text:
        if not _INTEGER.match(value):
            raise Malformed(value)
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
        raise Malformed(value)
    return value


def _floating(value: Any, text: bool) -> float:
    if text:
        try:
            return float(value)
        except ValueError as e:
            raise Malformed(value) from e
    if isinstance(value, str) and value in _NON_NUMERIC:
        return _NON_NUMERIC[value]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Malformed(value)
    return float(value)


def _boolean(value: Any, text: bool) -> bool:
    if not text:
        if not isinstance(value, bool):
            raise Malformed(value)
        return value
    lowered = value.lower()
    if lowered not in _TRUE | _FALSE:
        raise Malformed(value)
    return lowered in _TRUE


def _decimal(value: Any, precision: int, scale: int) -> decimal.Decimal:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise Malformed(value)
    try:
        number = decimal.Decimal(str(value)).quantize(decimal.Decimal(1).scaleb(-scale))
    except decimal.InvalidOperation as e:
        raise Malformed(value) from e
    if len(number.as_tuple().digits) > precision:
        raise Malformed(value)
    return number


def _parsed(value: Any, parse: Callable[[str], Any]) -> Any:
    if not isinstance(value, str):
        raise Malformed(value)
    try:
        return parse(value.strip())
    except ValueError as e:
        raise Malformed(value) from e


def _date(text: str) -> dt.date:
    """``text`` as Spark's readers parse a date (:data:`_DATE`); ``ValueError`` if it is none."""
    match = _DATE.match(text)
    if match is None:
        raise ValueError(text)
    year, month, day = match.groups()
    return dt.date(int(year), int(month or 1), int(day or 1))


def _timestamp(value: Any, text: bool) -> dt.datetime:
    if not text and isinstance(value, int) and not isinstance(value, bool):  # JSON: seconds since the epoch
        try:
            return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=value)
        except OverflowError as e:
            raise Malformed(value) from e
    parsed: dt.datetime = _parsed(value, dt.datetime.fromisoformat)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def json_record(line: str, names: list[str], convert: list[Converter]) -> list[Any] | None:
    """The values of the JSON Lines record ``line`` by column: ``None`` if it is not a JSON object, a
    :class:`PartlyMalformed` if a value does not convert (Spark keeps the others)."""
    try:
        value = json.loads(line)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    return _converted([value.get(n) for n in names], convert, malformed=False, empty=None)


def _converted(fields: list[Any], convert: list[Converter], malformed: bool, empty: Any) -> list[Any]:
    """``fields`` converted by column (``empty``: null), a :class:`PartlyMalformed` if ``malformed`` or one
    does not convert (it is null then)."""
    values = []
    for field, c in zip(fields, convert, strict=True):
        try:
            values.append(None if field is None or field == empty else c(field))
        except Malformed:
            values.append(None)
            malformed = True
    return PartlyMalformed(values) if malformed else values


class PartlyMalformed(list[Any]):
    """The values Spark's permissive readers keep of a malformed record (the fields that convert, the rest
    null): the record also goes to the corrupt column."""


def csv_record(fields: list[str], convert: list[Converter]) -> list[Any]:
    """The values of the CSV record ``fields`` by column (an empty or missing field is null, extra ones are
    left out), as a :class:`PartlyMalformed` if a field does not convert or their number is not the
    columns': Spark keeps the fields that convert and marks the record corrupt."""
    padded = [fields[i] if i < len(fields) else "" for i in range(len(convert))]
    return _converted(padded, convert, malformed=len(fields) != len(convert), empty="")


def check_options(format: str, options: dict[str, str]) -> None:
    """Refuse reader options the Python reader does not honour (it would read differently from Spark)."""
    allowed = CSV_OPTIONS if format == "csv" else frozenset()
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise PipelineDefinitionError(
            f"{format} options {unknown} are not supported by the Python file reader (supported: {sorted(allowed)}); "
            "configure a Hadoop filesystem for the landing directory's scheme (docs/execution-modes.md)"
        )


def records(
    lines: Iterable[str], format: str, schema: pa.Schema, options: dict[str, str]
) -> Iterator[tuple[list[Any] | None, str]]:
    """``(values, raw text)`` of each record of a file's ``lines``: values ``None`` if it does not parse, a
    :class:`PartlyMalformed` if a field does not convert (the others kept, as Spark's readers keep them)."""
    check_options(format, options)
    convert = converters(schema, text=format == "csv")
    names = schema.names
    texts = (line.rstrip("\r\n") for line in lines)
    if format == "json":
        for text in texts:
            if text.strip():
                yield json_record(text, names, convert), text
        return
    separator = options.get("sep", options.get("delimiter", ","))
    quote, escape = options.get("quote", '"'), options.get("escape", "\\")
    header = options.get("header", "true").lower() == "true"
    for number, text in enumerate(texts):
        if (header and number == 0) or not text:
            continue
        fields = next(csv.reader([text], delimiter=separator, quotechar=quote, escapechar=escape), [])
        yield csv_record(fields, convert), text
