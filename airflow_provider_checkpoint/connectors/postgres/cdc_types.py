"""The columns of a captured table, typed from PostgreSQL's catalog, and the conversion of their text values
(what pgoutput sends, and what the initial snapshot reads with ``::text``) into Arrow and Spark types.

Both the snapshot and the stream go through :func:`converter`, so a value is typed the same way whichever
of them delivered it. The reading session runs with ``TimeZone=UTC`` and ``DateStyle=ISO``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.exceptions import CdcSourceError

if TYPE_CHECKING:
    import pyarrow as pa

SESSION = "SET TimeZone = 'UTC'; SET DateStyle = 'ISO, YMD'; SET extra_float_digits = 3"
"""What every reading session runs first: values as text in one format, floats exact."""

_TEXT = {25: "text", 1043: "varchar", 1042: "bpchar", 2950: "uuid", 3802: "jsonb", 114: "json"}
_SIMPLE: dict[int, tuple[str, str]] = {
    16: ("bool", "BOOLEAN"),
    21: ("int2", "SMALLINT"),
    23: ("int4", "INT"),
    20: ("int8", "BIGINT"),
    700: ("float4", "FLOAT"),
    701: ("float8", "DOUBLE"),
    1082: ("date", "DATE"),
    1114: ("timestamp", "TIMESTAMP_NTZ"),
    1184: ("timestamptz", "TIMESTAMP"),
    1700: ("numeric", "DECIMAL"),
    **{oid: (name, "STRING") for oid, name in _TEXT.items()},
}
SUPPORTED = ", ".join(sorted({name for name, _ in _SIMPLE.values()}))


@dataclass(frozen=True)
class TableColumn:
    table: str
    name: str
    type_oid: int
    type_modifier: int
    type_name: str
    key: bool

    def where(self) -> str:
        return f"column {self.name} of table {self.table}"

    def spark_type(self) -> str:
        if self.type_oid not in _SIMPLE:
            raise CdcSourceError(
                f"{self.where()} has type {self.type_name}, which the CDC source does not convert (it converts "
                f"{SUPPORTED}); change its type to one of these (ALTER TABLE ... ALTER COLUMN ... TYPE ...) or "
                "leave the table out of the source"
            )
        name, spark = _SIMPLE[self.type_oid]
        if name != "numeric":
            return spark
        precision, scale = self.numeric_bounds()
        return f"DECIMAL({precision},{scale})"

    def numeric_bounds(self) -> tuple[int, int]:
        if self.type_modifier < 4:
            raise CdcSourceError(
                f"{self.where()} is numeric without precision and scale, which no Spark decimal holds; "
                "declare it numeric(p, s) with p <= 38"
            )
        precision, scale = (self.type_modifier - 4) >> 16, (self.type_modifier - 4) & 0xFFFF
        if precision > 38 or scale > precision:
            raise CdcSourceError(f"{self.where()} is numeric({precision}, {scale}): Spark decimals hold p <= 38")
        return precision, scale

    def arrow_type(self) -> pa.DataType:
        import pyarrow as pa

        spark = self.spark_type()
        if spark.startswith("DECIMAL"):
            return pa.decimal128(*self.numeric_bounds())
        return {
            "BOOLEAN": pa.bool_(),
            "SMALLINT": pa.int16(),
            "INT": pa.int32(),
            "BIGINT": pa.int64(),
            "FLOAT": pa.float32(),
            "DOUBLE": pa.float64(),
            "DATE": pa.date32(),
            "TIMESTAMP_NTZ": pa.timestamp("us"),
            "TIMESTAMP": pa.timestamp("us", tz="UTC"),
            "STRING": pa.string(),
        }[spark]


def _timestamp(text: str) -> datetime:
    return datetime.fromisoformat(text)


def _timestamptz(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


def _bool(text: str) -> bool:
    return text in ("t", "true")  # boolout's form (pgoutput), or a ::text cast's (the snapshot)


def _decimal(text: str) -> Decimal:
    value = Decimal(text)
    if not value.is_finite():
        raise ValueError("not a finite number")
    return value


_CONVERT: dict[str, Callable[[str], Any]] = {
    "BOOLEAN": _bool,
    "SMALLINT": int,
    "INT": int,
    "BIGINT": int,
    "FLOAT": float,
    "DOUBLE": float,
    "DATE": date.fromisoformat,
    "TIMESTAMP_NTZ": _timestamp,
    "TIMESTAMP": _timestamptz,
    "STRING": str,
}


def converter(column: TableColumn) -> Callable[[str | None], Any]:
    """The function from a value's text (``None``: NULL) to its Python value for Arrow; a value it cannot
    convert (``infinity`` dates, ``NaN`` numerics) raises :class:`CdcSourceError` naming the column."""
    spark = column.spark_type()
    convert = _decimal if spark.startswith("DECIMAL") else _CONVERT[spark]

    def typed(text: str | None) -> Any:
        if text is None:
            return None
        try:
            return convert(text)
        except (ValueError, InvalidOperation, OverflowError) as e:
            raise CdcSourceError(
                f"{column.where()}: value {text[:40]!r} of type {column.type_name} has no {spark} equivalent ({e})"
            ) from None

    return typed


_CATALOG = """
SELECT a.attname, a.atttypid, a.atttypmod, format_type(a.atttypid, a.atttypmod),
       coalesce(a.attnum = ANY (i.indkey), false)
FROM pg_attribute a
LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary
WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""


def quote(identifier: str) -> str:
    """An SQL identifier, double-quoted."""
    return '"' + identifier.replace('"', '""') + '"'


def quoted_table(table: str) -> str:
    """``schema.name`` as SQL names it (each part quoted: the names are the catalog's, case kept)."""
    schema, _, name = table.partition(".")
    return f"{quote(schema)}.{quote(name)}"


def table_columns(conn: Any, table: str) -> list[TableColumn]:
    """The columns of ``table`` (``schema.name``) from the catalog, primary key columns marked."""
    rows = conn.execute(_CATALOG, (quoted_table(table),)).fetchall()
    if not rows:
        raise CdcSourceError(f"table {table} has no columns or does not exist")
    return [TableColumn(table, n, oid, mod, type_name, key) for n, oid, mod, type_name, key in rows]


def identity_problem(conn: Any, table: str) -> str | None:
    """Why ``table`` cannot be captured for lack of a row identity (``None``: it can): PostgreSQL refuses
    the UPDATEs and DELETEs of a published table without one, and a delete would name no row."""
    row = conn.execute(
        "SELECT c.relreplident, EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary) "
        "FROM pg_class c WHERE c.oid = %s::regclass",
        (quoted_table(table),),
    ).fetchone()
    identity, has_key = str(row[0]), bool(row[1])
    if identity in ("f", "i") or (identity == "d" and has_key):
        return None
    why = "has REPLICA IDENTITY NOTHING" if identity == "n" else "has no primary key"
    return (
        f"table {table} {why}: once published, PostgreSQL would refuse its UPDATEs and DELETEs, and a delete "
        f"would name no row; add a primary key, or run ALTER TABLE {table} REPLICA IDENTITY FULL"
    )
