"""The SQL vocabulary of :class:`~.sink.PostgresTableSink`: names of its tables, types, quoted
identifiers, key predicates, catalog look-ups. No connection is opened here.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql
    from pyspark.sql.types import DataType


class SinkTable(Protocol):
    """What the target checks, the undo log, the partitions and the dead letters need of the sink
    (:class:`~.sink.PostgresTableSink`)."""

    uid: str
    schema: str
    table_name: str
    mode: str
    keys: list[str]
    digest: str
    undo_checkpoints: int
    dead_letters: tuple[str, str] | None
    max_refused_fraction: float
    create_table: bool
    partition_per_checkpoint: bool
    delete_when: str | None
    schema_evolution: str

    def target_name(self) -> str: ...

    def table(self, name: str | None = None) -> Any: ...


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
CHECKPOINT_COLUMN = "_checkpoint_id"
"""Append mode: the checkpoint that wrote each row (what a restore deletes by)."""
NULLS_NOT_DISTINCT_SINCE = 150000
"""PostgreSQL 15: unique indexes may match null values (``NULLS NOT DISTINCT``)."""
CLAIMS = "checkpoint_sink_claims"
MARKERS = "checkpoint_sink_markers"
DEAD_LETTER_SUFFIX = "_dl"
DEAD_LETTER_STAGED = ("column_name", "key", "record", "error")
"""The columns of a dead-letter staging table (all ``text``), as :meth:`~.load.Refusal.dead_letter` makes them."""


def split_table(uid: str, table: str) -> tuple[str, str]:
    """``schema.table`` or ``table`` (schema ``public``) as two plain identifiers."""
    parts = table.split(".")
    if len(parts) == 1:
        parts = ["public", parts[0]]
    if len(parts) != 2 or not all(_IDENTIFIER.match(p) for p in parts):
        raise PipelineDefinitionError(
            f"{uid}: table {table!r} must be 'name' or 'schema.name', each a letter or '_' then letters, digits, '_'"
        )
    return parts[0], parts[1]


def check_identifiers(uid: str, what: str, names: list[str]) -> None:
    bad = [n for n in names if not _IDENTIFIER.match(n)]
    if bad:
        raise PipelineDefinitionError(f"{uid}: {what} {bad} are not plain PostgreSQL identifiers")


def sink_digest(schema: str, table: str, uid: str) -> str:
    """10 hex digits naming this sink's objects beside its table (staging tables, undo table)."""
    return hashlib.sha256(f"{schema}.{table}\0{uid}".encode()).hexdigest()[:10]


def staging_table(digest: str, checkpoint_id: int, attempt_tag: str) -> str:
    """``_cks_<sink>_c<checkpoint>_<attempt>``: unique per checkpoint attempt, at most 63 bytes."""
    return f"_cks_{digest}_c{checkpoint_id}_{hashlib.sha256(attempt_tag.encode()).hexdigest()[:12]}"


def staging_pattern(digest: str, checkpoint_id: int | None = None, dead_letters: bool = False) -> re.Pattern[str]:
    """Names :func:`staging_table` gives for this sink (and ``checkpoint_id``, if given); with
    ``dead_letters``, those of :func:`dead_letter_staging` too."""
    checkpoint = r"[1-9]\d{0,18}" if checkpoint_id is None else str(checkpoint_id)
    suffix = f"(?:{DEAD_LETTER_SUFFIX})?" if dead_letters else ""
    return re.compile(rf"^_cks_{digest}_c{checkpoint}_[0-9a-f]{{12}}{suffix}$")


def staged_checkpoint(staging: str) -> int:
    """The checkpoint id in a name :func:`staging_pattern` matched."""
    found = re.match(r"^_cks_[0-9a-f]{10}_c(\d+)_", staging)
    if found is None:
        raise ValueError(f"{staging!r} is not the name of a staging table")
    return int(found.group(1))


def dead_letter_staging(staging: str) -> str:
    """The staging table of the dead letters staged with ``staging`` (:data:`DEAD_LETTER_STAGED`)."""
    return staging + DEAD_LETTER_SUFFIX


def undo_table(digest: str) -> str:
    return f"_cks_{digest}_undo"


def staged_key_index(staging: str) -> str:
    """The unique index on the keys the step builds on the upsert staging table a first load makes the table of."""
    return f"{staging}_key"


NAME_BYTES = 63
"""PostgreSQL's longest identifier (``NAMEDATALEN - 1``)."""


def object_name(name1: str, name2: str, label: str) -> str:
    """``name1_name2_label`` shortened to :data:`NAME_BYTES` as PostgreSQL's ``makeObjectName`` does it (the
    longer of ``name1`` and ``name2`` loses its last character until it fits); plain identifiers are ASCII."""
    available = NAME_BYTES - len(label) - 2
    first, second = len(name1), len(name2)
    while first + second > available:
        if first > second:
            first -= 1
        else:
            second -= 1
    return f"{name1[:first]}_{name2[:second]}_{label}"


def key_constraint_candidates(table: str, keys: Sequence[str], tries: int = 10) -> list[str]:
    """The names PostgreSQL tries, in order, for ``ALTER TABLE table ADD UNIQUE (keys)``'s constraint and index
    (``ChooseRelationName``: ``<table>_<keys>_key``, then ``…_key1``, ``…_key2``, …, the first unused in the schema)."""
    return [object_name(table, "_".join(keys), "key" + (str(i) if i else "")) for i in range(tries)]


def pg_type(uid: str, column: str, data_type: DataType) -> str:
    """The PostgreSQL type of a Spark column; refused where there is none."""
    from pyspark.sql import types as T

    simple: dict[type[DataType], str] = {
        T.StringType: "text",
        T.BooleanType: "boolean",
        T.ByteType: "smallint",
        T.ShortType: "smallint",
        T.IntegerType: "integer",
        T.LongType: "bigint",
        T.FloatType: "real",
        T.DoubleType: "double precision",
        T.DateType: "date",
        T.TimestampType: "timestamp with time zone",
        T.TimestampNTZType: "timestamp without time zone",
        T.BinaryType: "bytea",
    }
    if isinstance(data_type, T.DecimalType):
        return f"numeric({data_type.precision},{data_type.scale})"
    if isinstance(data_type, T.ArrayType) and not isinstance(data_type.elementType, T.ArrayType):
        return pg_type(uid, column, data_type.elementType) + "[]"
    for spark_type, name in simple.items():
        if isinstance(data_type, spark_type):
            return name
    raise PipelineDefinitionError(
        f"{uid}: column {column!r} has Spark type {data_type.simpleString()}, which has no PostgreSQL mapping "
        "(flatten structs and maps, or serialise them to a string column)"
    )


def ident(*names: str) -> sql.Composable:
    """A (schema-)qualified, quoted identifier."""
    from psycopg import sql

    return sql.Identifier(*names)


def idents(names: list[str], prefix: str | None = None) -> sql.Composable:
    from psycopg import sql

    return sql.SQL(", ").join(sql.Identifier(*([prefix] if prefix else []), n) for n in names)


def keys_equal(keys: list[str], left: str, right: str, nulls: Sequence[bool] | None = None) -> sql.Composable:
    """``left``'s key equals ``right``'s, for rows whose key parts are null exactly where ``nulls`` says
    (default none): ``=`` on the other parts, ``IS NULL`` on both sides for those — each form served by
    a btree index, unlike ``IS NOT DISTINCT FROM``."""
    from psycopg import sql

    nulls = nulls or [False] * len(keys)
    return sql.SQL(" AND ").join(
        sql.SQL("{0} IS NULL AND {1} IS NULL" if null else "{0} = {1}").format(ident(left, k), ident(right, k))
        for k, null in zip(keys, nulls, strict=True)
    )


def null_filter(keys: list[str], nulls: Sequence[bool], alias: str) -> sql.Composable:
    """``alias``'s key parts are null exactly where ``nulls`` says."""
    from psycopg import sql

    return sql.SQL(" AND ").join(
        sql.SQL("{} IS NULL" if null else "{} IS NOT NULL").format(ident(alias, k))
        for k, null in zip(keys, nulls, strict=True)
    )


def null_patterns(
    db: psycopg.Connection[Any],
    table: sql.Composable,
    keys: list[str],
    where: sql.Composable | None = None,
    params: Sequence[Any] = (),
) -> list[tuple[bool, ...]]:
    """Which key parts are null, for each pattern ``table``'s rows (those ``where`` selects) show."""
    from psycopg import sql

    nulls = sql.SQL(", ").join(sql.SQL("{} IS NULL").format(ident(k)) for k in keys)
    condition = sql.SQL(" WHERE ") + where if where is not None else sql.SQL("")
    rows = db.execute(sql.SQL("SELECT DISTINCT {} FROM {}{}").format(nulls, table, condition), params).fetchall()
    return [tuple(bool(v) for v in r) for r in rows]


def table_columns(db: psycopg.Connection[Any], schema: str, table: str) -> dict[str, str]:
    """Column → PostgreSQL type of ``schema.table``, in order (empty if it does not exist)."""
    rows = db.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
        "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        [f'"{schema}"."{table}"'],
    ).fetchall()
    return {r[0]: r[1] for r in rows}
