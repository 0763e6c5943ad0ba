"""The step side of :class:`~.sink.PostgresTableSink` around the load: the target table checked (or
created), the staging table created beside it, and, in upsert mode, the staged keys checked.

The step changes no existing target table: a table that does not match the input (columns, upsert
keys' unique index, partitioning by checkpoint when the sink attaches partitions) is refused with
:class:`SinkSchemaError`, naming what differs. With ``schema_evolution="additive"`` an input column the
table lacks, or a number column the input widens, is staged with the input's type, and the commit
transaction adds or widens it before it moves the rows (:func:`follow_staged`): a failed commit leaves the
table as it was.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.connectors.postgres import partitions
from airflow_provider_checkpoint.connectors.postgres import sql as pg
from airflow_provider_checkpoint.connectors.postgres.sql import CHECKPOINT_COLUMN, NULLS_NOT_DISTINCT_SINCE
from airflow_provider_checkpoint.exceptions import SinkSchemaError, SinkValueError

if TYPE_CHECKING:
    import psycopg
    import pyarrow as pa
    from pyspark.sql.types import StructType

    from airflow_provider_checkpoint.connectors.postgres.connection import PgConnection

log = logging.getLogger(__name__)


def _create(sink: pg.SinkTable, db: psycopg.Connection[Any], schema: StructType) -> None:
    """``CREATE TABLE IF NOT EXISTS`` from the input's columns: in append mode with ``_checkpoint_id``
    (and partitioned by it when the sink attaches partitions), in upsert mode with a unique key."""
    from psycopg import sql

    columns = [sql.SQL("{} {}").format(pg.ident(c), sql.SQL(t)) for c, t in new_types(sink, schema).items()]
    if sink.mode == "append":
        columns.append(sql.SQL("{} bigint NOT NULL").format(pg.ident(CHECKPOINT_COLUMN)))
    elif db.info.server_version >= NULLS_NOT_DISTINCT_SINCE:  # a null key part is a key value, as in every sink
        columns.append(sql.SQL("UNIQUE NULLS NOT DISTINCT ({})").format(pg.idents(sink.keys)))
    else:
        columns.append(sql.SQL("PRIMARY KEY ({})").format(pg.idents(sink.keys)))
    by = sql.SQL(" PARTITION BY LIST ({})").format(pg.ident(CHECKPOINT_COLUMN))
    partitioned = by if sink.partition_per_checkpoint else sql.SQL("")
    db.execute(
        sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}){}").format(sink.table(), sql.SQL(", ").join(columns), partitioned)
    )
    log.info("sink %s: created table %s", sink.uid, sink.target_name())


def new_types(sink: pg.SinkTable, schema: StructType) -> dict[str, str]:
    """The input's columns → the PostgreSQL types a table the sink creates gives them."""
    return {f.name: pg.pg_type(sink.uid, f.name, f.dataType) for f in schema.fields}


def born_in_commit(sink: pg.SinkTable, db: psycopg.Connection[Any]) -> bool:
    """Whether the table is absent and the sink will make it, in the commit that first loads it, of that
    checkpoint's staging table (:func:`~.staging.take_over`): with ``create_table``, a server that has
    ``NULLS NOT DISTINCT`` (15+), no ``partition_per_checkpoint`` (it creates a partitioned table) and no
    ``delete_when`` (its column is no column of the table)."""
    return (
        sink.create_table
        and not sink.partition_per_checkpoint
        and sink.delete_when is None
        and db.info.server_version >= NULLS_NOT_DISTINCT_SINCE
        and not pg.table_columns(db, sink.schema, sink.table_name)
    )


def check_target(
    sink: pg.SinkTable, db: psycopg.Connection[Any], schema: StructType, create: bool = True
) -> dict[str, str]:
    """The target's types of the input columns ``schema``, the table created first if absent and the sink
    may (unless not ``create``: then an absent table the sink may create is not checked, and has no types);
    refused unless its columns are exactly the input's (and ``_checkpoint_id`` in append mode), an
    upsert table has a unique index on exactly the keys, and an append table's partitioning suits
    its commits (:func:`~.partitions.check_partitioning`). The ``delete_when`` column of an upsert is no
    column of the table: the staging table has it (``boolean``), last."""
    from pyspark.sql.types import StructType

    schema = StructType([f for f in schema.fields if f.name != sink.delete_when])
    target = pg.table_columns(db, sink.schema, sink.table_name)
    if not target:
        if not sink.create_table:
            raise SinkSchemaError(f"sink {sink.uid}: table {sink.target_name()} does not exist (create_table=False)")
        if not create:
            return {}
        _create(sink, db, schema)
        target = pg.table_columns(db, sink.schema, sink.table_name)
    expected = [f.name for f in schema.fields]
    own = [CHECKPOINT_COLUMN] if sink.mode == "append" else []
    evolved = _evolved(sink, schema, target)
    missing = [c for c in [*expected, *own] if c not in target and c not in evolved]
    extra = [c for c in target if c not in expected and c not in own]
    if missing or extra:
        raise SinkSchemaError(
            f"sink {sink.uid}: table {sink.target_name()} does not match the input: "
            f"missing columns {missing}, columns the input does not have {extra}"
            + (_HOW_TO_ADD if sink.schema_evolution == "none" and set(missing) - {CHECKPOINT_COLUMN} else "")
        )
    if sink.mode == "upsert" and unique_index(sink, db) is None:
        raise SinkSchemaError(
            f"sink {sink.uid}: table {sink.target_name()} has no unique index on exactly {sink.keys} (upsert keys)"
        )
    partitions.check_partitioning(sink, db)
    if evolved:
        log.info("sink %s: the commit follows the input's schema in %s: %s", sink.uid, sink.target_name(), evolved)
    staged = {c: evolved.get(c) or target[c] for c in expected}
    return {**staged, **({sink.delete_when: "boolean"} if sink.delete_when else {})}


_HOW_TO_ADD = (
    " (schema_evolution='additive' adds an input column in the checkpoint's commit; else ALTER TABLE … ADD COLUMN "
    "first)"
)
_NUMBERS = {"smallint": ("int", 1), "integer": ("int", 2), "bigint": ("int", 3), "real": ("float", 1)}
_NUMBERS["double precision"] = ("float", 2)


def _evolved(sink: pg.SinkTable, schema: StructType, target: dict[str, str]) -> dict[str, str]:
    """With ``schema_evolution="additive"``: the input columns the commit adds or widens → their PostgreSQL
    type (the table's ``target`` columns → types); a number column the input retypes otherwise is refused,
    naming table, column and both types."""
    if sink.schema_evolution == "none" or not target:
        return {}
    evolved: dict[str, str] = {}
    for f in schema.fields:
        if f.name not in target:
            evolved[f.name] = pg.pg_type(sink.uid, f.name, f.dataType)
            continue
        old = _NUMBERS.get(target[f.name])
        new_type = pg.pg_type(sink.uid, f.name, f.dataType) if old else None
        new = _NUMBERS.get(new_type or "")
        if old is None or new is None or new == old:
            continue
        if new[0] != old[0]:
            raise SinkSchemaError(
                f"sink {sink.uid}: column {f.name} of {sink.target_name()} is {target[f.name]}, the input's is "
                f"{new_type}: not a widening (schema_evolution adds columns and widens numbers only)"
            )
        if new[1] > old[1]:
            evolved[f.name] = str(new_type)
    return evolved


def follow_staged(sink: pg.SinkTable, db: psycopg.Connection[Any], staging: str) -> list[str]:
    """In the commit transaction, with ``schema_evolution="additive"``: add each column of ``staging`` the
    table lacks (nullable, the staged type) and widen each number column ``staging`` holds wider, in the
    table and in its undo table (before-images of a restore); the changes made, as SQL fragments."""
    from psycopg import sql

    if sink.schema_evolution == "none":
        return []
    staged = pg.table_columns(db, sink.schema, staging)
    undo_name = pg.undo_table(sink.digest)
    tables = [sink.table_name, *([undo_name] if pg.table_columns(db, sink.schema, undo_name) else [])]
    changes: list[str] = []
    for name in tables:
        current = pg.table_columns(db, sink.schema, name)
        for column, kind in staged.items():
            if column in (sink.delete_when, CHECKPOINT_COLUMN):
                continue
            old, new = _NUMBERS.get(current.get(column, "")), _NUMBERS.get(kind)
            if column not in current:
                change = sql.SQL("ADD COLUMN {} {}").format(pg.ident(column), sql.SQL(kind))
            elif old and new and old[0] == new[0] and new[1] > old[1]:
                change = sql.SQL("ALTER COLUMN {} TYPE {}").format(pg.ident(column), sql.SQL(kind))
            else:
                continue
            db.execute(sql.SQL("ALTER TABLE {} ").format(sink.table(name)) + change)
            if name == sink.table_name:
                changes.append(change.as_string(db))
    if changes:
        log.info("sink %s: the commit changed %s: %s", sink.uid, sink.target_name(), "; ".join(changes))
    return changes


def unique_index(sink: pg.SinkTable, db: psycopg.Connection[Any]) -> bool | None:
    """Whether the table's unique index on exactly the keys matches null key parts (``NULLS NOT
    DISTINCT``, PostgreSQL 15+); ``None`` if it has no such index."""
    nulls_match = "i.indnullsnotdistinct" if db.info.server_version >= NULLS_NOT_DISTINCT_SINCE else "false"
    row = db.execute(
        f"SELECT {nulls_match} FROM pg_index i WHERE i.indrelid = to_regclass(%s) AND i.indisunique "
        "AND i.indpred IS NULL AND (SELECT array_agg(attname ORDER BY attname) FROM pg_attribute "
        "WHERE attrelid = i.indrelid AND attnum = ANY(i.indkey)) = %s::name[] ORDER BY 1 DESC LIMIT 1",
        [f'"{sink.schema}"."{sink.table_name}"', sorted(sink.keys)],
    ).fetchone()
    return None if row is None else bool(row[0])


def create_staging(
    sink: pg.SinkTable, db: psycopg.Connection[Any], staging: str, types: dict[str, str], checkpoint_id: int
) -> None:
    """(Re)create the staging table of this attempt: an ordinary, WAL-logged table (never ``UNLOGGED``,
    which crash recovery empties), without indexes; the input's columns with the target's types, or,
    when the sink attaches partitions, the partition the commit will attach
    (:func:`~.partitions.create_staging`)."""
    from psycopg import sql

    db.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sink.table(staging)))
    if sink.partition_per_checkpoint:
        partitions.create_staging(sink, db, staging, checkpoint_id)
        return
    definition = sql.SQL(", ").join(sql.SQL("{} {}").format(pg.ident(c), sql.SQL(t)) for c, t in types.items())
    db.execute(sql.SQL("CREATE TABLE {} ({})").format(sink.table(staging), definition))


def check_staged(sink: pg.SinkTable, conn: PgConnection, staging: str, null_keys: bool, analyze: bool = True) -> None:
    """In upsert mode: with ``analyze`` ``ANALYZE`` the staging table (so the commit joins it with the table by
    index; not for a commit that makes the table of it) and refuse a key staged twice, or a null key part where
    the table's unique index would not match it (``null_keys`` false): the commit could not succeed. An append
    commit reads the staging table once, in order (or attaches it): nothing to check or plan."""
    if sink.mode == "upsert":
        staged_twice(sink, conn, staging, null_keys, refuse=True, analyze=analyze)


def staged_twice(
    sink: pg.SinkTable, conn: PgConnection, staging: str, null_keys: bool, refuse: bool = False, analyze: bool = True
) -> bool:
    """With ``analyze`` ``ANALYZE`` the upsert staging table, refuse a null key part the table's unique index
    would not match (``null_keys`` false), and tell whether a key is staged twice (with ``refuse``: refuse it).
    Keys are compared as the unique index compares them (nulls equal, as one row per key groups them)."""
    from psycopg import sql

    with conn.connect(autocommit=True) as db:
        if analyze:
            db.execute(sql.SQL("ANALYZE {}").format(sink.table(staging)))
        keys = pg.idents(sink.keys)
        null = sql.SQL(" OR ").join(sql.SQL("{} IS NULL").format(pg.ident(k)) for k in sink.keys)
        refused = sql.SQL("false") if null_keys else null
        bad = db.execute(
            sql.SQL("SELECT {k}, 'a null key' FROM {t} WHERE {n} UNION ALL (SELECT {k}, 'staged twice' FROM {t} "
                    "GROUP BY {k} HAVING count(*) > 1) LIMIT 1").format(k=keys, t=sink.table(staging), n=refused)
        ).fetchone()  # fmt: skip
    if bad is None or (bad[-1] == "staged twice" and not refuse):
        return bad is not None
    key = ", ".join(f"{k}={v!r}" for k, v in zip(sink.keys, bad[:-1], strict=True))
    if bad[-1] == "a null key":
        raise _null_key(sink, key)
    raise SinkValueError(f"sink {sink.uid}: upsert key ({key}) is {bad[-1]} in this checkpoint")


def _null_key(sink: pg.SinkTable, key: str) -> SinkValueError:
    return SinkValueError(
        f"sink {sink.uid}: upsert key ({key}) is a null key, which the unique index of "
        f"{sink.target_name()} on {sink.keys} does not match (nulls distinct, or a primary key): create "
        "it UNIQUE NULLS NOT DISTINCT (PostgreSQL 15+, as the sink creates tables), or fill or filter "
        "null keys upstream"
    )


_EXACT = {"text", "bytea", "boolean", "smallint", "integer", "bigint", "date"}
_EXACT |= {"timestamp with time zone", "timestamp without time zone"}


def keys_exact(sink: pg.SinkTable, types: dict[str, str]) -> bool:
    """Whether the staging types ``types`` of the keys compare values as they are, as Arrow and Spark group
    them (not ``character(n)``'s padding, a timestamp's rounded precision, ``citext``, another type's operator)."""
    return all(t in _EXACT or t.startswith(("numeric", "character varying")) for t in (types[k] for k in sink.keys))


def check_reduced(
    sink: pg.SinkTable, conn: PgConnection, staging: str, rows: pa.Table, null_keys: bool, analyze: bool
) -> None:
    """:func:`check_staged` of ``rows``, staged after the driver reduced them to one row per key
    (:meth:`~airflow_provider_checkpoint.connectors.base.upsert_rule.UpsertRows.collect`) into keys of
    :func:`keys_exact` types: a null key part is refused from ``rows`` where the unique index would not match
    it (``null_keys`` false), and with ``analyze`` (a commit that joins the staging table with the table) the
    staging table is analysed; no key is looked for twice in the server."""
    import pyarrow.compute as pc
    from psycopg import sql

    if not null_keys:
        nulls = [int(i) for k in sink.keys if (i := pc.index(pc.is_null(rows[k]), True).as_py()) >= 0]
        if nulls:
            row = rows.slice(min(nulls), 1).to_pylist()[0]
            raise _null_key(sink, ", ".join(f"{k}={row[k]!r}" for k in sink.keys))
    if analyze:
        with conn.connect(autocommit=True) as db:
            db.execute(sql.SQL("ANALYZE {}").format(sink.table(staging)))
