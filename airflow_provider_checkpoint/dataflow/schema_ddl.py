"""Spark's schema DDL (``"user STRING, ts LONG"``) read in pure Python, when a DAG file is parsed.

:func:`parse_schema` accepts what ``StructType.fromDDL`` accepts for a read schema: columns
``name TYPE`` separated by commas, names plain or backquoted (a doubled backquote inside), type
names in any case with Spark's aliases (``LONG`` = ``BIGINT``, ``INTEGER`` = ``INT``,
``DEC``/``NUMERIC`` = ``DECIMAL``, ``REAL`` = ``FLOAT``, ``BYTE``, ``SHORT``), ``DECIMAL(p,s)``,
``CHAR(n)``, ``VARCHAR(n)``, ``STRING COLLATE c``, intervals, ``TIMESTAMP WITH LOCAL TIME ZONE``,
nested ``ARRAY<t>``, ``MAP<k, v>`` and ``STRUCT<name[:] t, ...>``, and per column ``NOT NULL`` and
``COMMENT '...'``. Types come back in Spark's ``simpleString`` form (``bigint``,
``decimal(10,0)``, ``array<struct<a:int>>``). A mistake raises :class:`DdlError` with its
position (1-based) and, for an unknown type, the closest known names and the list of them.
Top-level names are compared case-insensitively, as Spark's file readers do by default: one
given twice is refused.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

_SIMPLE = {
    "boolean": "boolean",
    "tinyint": "tinyint",
    "byte": "tinyint",
    "smallint": "smallint",
    "short": "smallint",
    "int": "int",
    "integer": "int",
    "bigint": "bigint",
    "long": "bigint",
    "float": "float",
    "real": "float",
    "double": "double",
    "date": "date",
    "timestamp": "timestamp",
    "timestamp_ltz": "timestamp",
    "timestamp_ntz": "timestamp_ntz",
    "binary": "binary",
    "void": "void",
    "variant": "variant",
}
_DECIMAL = ("decimal", "dec", "numeric")
_SIZED = {"char": "char", "character": "char", "varchar": "varchar"}
_INTERVAL_UNITS = ("year", "month", "day", "hour", "minute", "second")
KNOWN_TYPES = (
    "BOOLEAN, TINYINT (BYTE), SMALLINT (SHORT), INT (INTEGER), BIGINT (LONG), FLOAT (REAL), DOUBLE, "
    "DECIMAL(p,s) (DEC, NUMERIC), STRING, CHAR(n), VARCHAR(n), BINARY, DATE, TIMESTAMP (TIMESTAMP_LTZ), "
    "TIMESTAMP_NTZ, TIME(p), INTERVAL, VOID, VARIANT, ARRAY<t>, MAP<k, v>, STRUCT<name: t, ...>"
)
_NAMES = sorted({*_SIMPLE, *_DECIMAL, *_SIZED, "string", "time", "interval", "array", "map", "struct"})

_TOKEN = re.compile(
    r"\s*(?:(?P<ident>[A-Za-z0-9_]+)|(?P<quoted>`(?:[^`]|``)*`)|(?P<string>'(?:[^'\\]|\\.|'')*'|\"(?:[^\"\\]|\\.|\"\")*\")"
    r"|(?P<punct>[,<>():.-])|(?P<bad>\S))",
    re.DOTALL,
)


class DdlError(ValueError):
    """A schema DDL Spark would refuse: ``message`` says what, ``position`` where (1-based), ``hint`` how to fix it."""

    def __init__(self, message: str, position: int, hint: str = "") -> None:
        super().__init__(f"{message} at position {position}{hint}")
        self.message = message
        self.position = position


@dataclass(frozen=True)
class Column:
    """One top-level column of a schema: its name, its type (Spark's ``simpleString``), nullability."""

    name: str
    type: str
    nullable: bool = True


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str
    position: int  # 1-based

    @property
    def word(self) -> str:
        return self.text.lower() if self.kind == "ident" else ""


def _tokens(ddl: str) -> list[_Token]:
    tokens: list[_Token] = []
    at = 0
    while at < len(ddl):
        m = _TOKEN.match(ddl, at)
        if m is None or m.lastgroup is None:  # only trailing blanks are left
            break
        if m.lastgroup == "bad":
            raise DdlError(f"unexpected character {m.group('bad')!r}", m.start("bad") + 1)
        tokens.append(_Token(m.lastgroup, m.group(m.lastgroup), m.start(m.lastgroup) + 1))
        at = m.end()
    tokens.append(_Token("end", "", len(ddl) + 1))
    return tokens


class _Parser:
    def __init__(self, ddl: str) -> None:
        self.tokens = _tokens(ddl)
        self.at = 0

    @property
    def token(self) -> _Token:
        return self.tokens[self.at]

    def take(self) -> _Token:
        token = self.token
        self.at += 1
        return token

    def accept(self, text: str) -> bool:
        if self.token.text.lower() == text and self.token.kind in ("ident", "punct"):
            self.at += 1
            return True
        return False

    def expect(self, text: str, what: str) -> None:
        if not self.accept(text):
            shown = repr(self.token.text) if self.token.kind != "end" else "the end"
            raise DdlError(f"expected {what}, found {shown}", self.token.position)

    def integer(self) -> int:
        token = self.take()
        if token.kind != "ident" or not token.text.isdigit():
            raise DdlError(f"expected a number, found {token.text!r}", token.position)
        return int(token.text)

    def name(self) -> str:
        token = self.take()
        if token.kind == "quoted":
            return token.text[1:-1].replace("``", "`")
        if token.kind != "ident":
            shown = repr(token.text) if token.kind != "end" else "the end"
            raise DdlError(f"expected a column name, found {shown}", token.position)
        return token.text

    def columns(self, closing: str, top: bool = False) -> list[Column]:
        """``name [:] type [NOT NULL] [COMMENT '...']`` separated by commas, up to
        ``closing``; at the ``top`` level a name given twice is refused (Spark compares names
        case-insensitively by default)."""
        columns: list[Column] = []
        seen: set[str] = set()
        while True:
            start = self.token.position
            name = self.name()
            if top and name.lower() in seen:
                raise DdlError(f"column {name!r} is named twice", start)
            seen.add(name.lower())
            self.accept(":")
            type_ = self.type()
            nullable = True
            while True:
                if self.accept("not"):
                    self.expect("null", "NULL after NOT")
                    nullable = False
                elif self.accept("comment"):
                    if self.take().kind != "string":
                        raise DdlError("COMMENT needs a quoted string", self.tokens[self.at - 1].position)
                else:
                    break
            columns.append(Column(name, type_, nullable))
            if not self.accept(","):
                break
        if self.token.kind != "end" and self.token.text != closing:
            found = self.token.text
            raise DdlError(
                f"expected ',' or {closing or 'the end'} after column {name!r}, found {found!r}", self.token.position
            )
        return columns

    def type(self) -> str:
        token = self.take()
        word = token.word
        if word in ("timestamp", "time") and self.token.word in ("with", "without"):
            return self.zoned(word, token.position)
        if word in _SIMPLE:
            return _SIMPLE[word]
        if word == "string":
            if self.accept("collate"):
                return f"string collate {self.name()}"
            return "string"
        if word in _DECIMAL:
            precision, scale = 10, 0
            if self.accept("("):
                precision = self.integer()
                scale = self.integer() if self.accept(",") else 0
                self.expect(")", "')'")
            if not 1 <= precision <= 38 or not 0 <= scale <= precision:
                raise DdlError(
                    f"DECIMAL({precision},{scale}) needs 1 <= precision <= 38 and 0 <= scale <= precision",
                    token.position,
                )
            return f"decimal({precision},{scale})"
        if word in _SIZED:
            self.expect("(", f"'(' and a length after {token.text}")
            length = self.integer()
            self.expect(")", "')'")
            return f"{_SIZED[word]}({length})"
        if word == "time":
            precision = 6
            if self.accept("("):
                precision = self.integer()
                self.expect(")", "')'")
            if self.token.word == "without":
                self.zoned("time", token.position)
            return f"time({precision})"
        if word == "interval":
            return self.interval()
        if word == "array":
            self.expect("<", "'<' after ARRAY")
            element = self.type()
            self.expect(">", "'>' closing ARRAY<")
            return f"array<{element}>"
        if word == "map":
            self.expect("<", "'<' after MAP")
            key = self.type()
            self.expect(",", "',' between the key and value types of MAP")
            value = self.type()
            self.expect(">", "'>' closing MAP<")
            return f"map<{key},{value}>"
        if word == "struct":
            self.expect("<", "'<' after STRUCT")
            fields = [] if self.token.text == ">" else self.columns(">")
            self.expect(">", "'>' closing STRUCT<")
            return "struct<" + ",".join(f"{_shown(f.name)}:{f.type}" for f in fields) + ">"
        shown = "the end" if token.kind == "end" else repr(token.text)
        close = difflib.get_close_matches(word, _NAMES, n=2, cutoff=0.6) if word else []
        hint = f" (did you mean {' or '.join(c.upper() for c in close)}?)" if close else ""
        raise DdlError(f"unknown type {shown}", token.position, f"{hint}; known types: {KNOWN_TYPES}")

    def zoned(self, word: str, position: int) -> str:
        """``TIMESTAMP WITH LOCAL TIME ZONE``, ``TIMESTAMP WITHOUT TIME ZONE``, ``TIME WITHOUT TIME ZONE``."""
        local = self.accept("with")
        if not local:
            self.expect("without", "WITH or WITHOUT")
        if local and word == "time":
            raise DdlError("TIME has no time zone", position)
        if local:
            self.expect("local", "LOCAL after WITH")
        self.expect("time", "TIME ZONE")
        self.expect("zone", "ZONE after TIME")
        return "timestamp" if local else "timestamp_ntz" if word == "timestamp" else "time(6)"

    def interval(self) -> str:
        start = self.token.word
        if start not in _INTERVAL_UNITS:
            return "interval"
        self.take()
        end = start
        if self.accept("to"):
            end = self.token.word
            if end not in _INTERVAL_UNITS[_INTERVAL_UNITS.index(start) + 1 :]:
                raise DdlError(f"INTERVAL {start.upper()} TO needs a smaller unit", self.token.position)
            self.take()
        kind = "year" if start in ("year", "month") else "day"
        if kind == "year" and end not in ("year", "month") or kind == "day" and end in ("year", "month"):
            raise DdlError(
                f"INTERVAL {start.upper()} TO {end.upper()} mixes year-month and day-time", self.token.position
            )
        return f"interval {start} to {end}" if end != start else f"interval {start}"


def _shown(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else "`" + name.replace("`", "``") + "`"


def parse_schema(ddl: str) -> list[Column]:
    """The columns of a schema DDL (``a INT, b STRUCT<c: STRING>``, or ``STRUCT<...>`` whole); refused
    with :class:`DdlError` where Spark's parser would refuse it, and for a column named twice."""
    parser = _Parser(ddl)
    if parser.token.kind == "end":
        raise DdlError("a schema needs at least one column", 1)
    if parser.token.word == "struct" and parser.tokens[1].text == "<":
        parser.at = 2
        columns = [] if parser.token.text == ">" else parser.columns(">", top=True)
        parser.expect(">", "'>' closing STRUCT<")
    else:
        columns = parser.columns("", top=True)
    if parser.token.kind != "end":
        raise DdlError(f"unexpected {parser.token.text!r}", parser.token.position)
    return columns


def declared_flat(ddl: str, timestamp_type: str) -> StructType | None:
    """The columns of the schema ``ddl`` as ``StructType.fromDDL`` gives them (comments aside), parsed without
    a Spark session (:func:`parse_schema`) when every column has a flat type; ``None`` otherwise, or when a
    ``TIMESTAMP`` column's type depends on the session's ``spark.sql.timestampType`` (``timestamp_type``)
    other than ``TIMESTAMP_LTZ``: ask Spark then."""
    from pyspark.sql import types as T

    simple: dict[str, T.DataType] = {
        "boolean": T.BooleanType(),
        "tinyint": T.ByteType(),
        "smallint": T.ShortType(),
        "int": T.IntegerType(),
        "bigint": T.LongType(),
        "float": T.FloatType(),
        "double": T.DoubleType(),
        "string": T.StringType(),
        "binary": T.BinaryType(),
        "date": T.DateType(),
        "timestamp_ntz": T.TimestampNTZType(),
    }
    if timestamp_type == "TIMESTAMP_LTZ":
        simple["timestamp"] = T.TimestampType()
    try:
        columns = parse_schema(ddl)
    except DdlError:
        return None  # Spark's parser gives its own message
    fields = []
    for column in columns:
        decimal = re.fullmatch(r"decimal\((\d+),(\d+)\)", column.type)
        found = T.DecimalType(int(decimal[1]), int(decimal[2])) if decimal else simple.get(column.type)
        if found is None:
            return None
        fields.append(T.StructField(column.name, found, column.nullable))
    return T.StructType(fields)
