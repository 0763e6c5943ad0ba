"""Append commits that attach the staged rows instead of copying them (``partition_per_checkpoint``).

Opt-in, for an append table partitioned ``PARTITION BY LIST (_checkpoint_id)`` (the sink creates it
so with ``create_table``, and refuses an existing table partitioned otherwise: it never changes the
structure of a table it did not create). Each checkpoint becomes one partition of the table:

- **Step**: the staging table is created ``LIKE`` the table (its columns, ``NOT NULL`` and ``CHECK``
  constraints), with ``_checkpoint_id`` defaulting to the checkpoint and ``CHECK (_checkpoint_id =
  <checkpoint>)``, and loaded as every staging table is: ordinary, WAL-logged, one per step attempt.
- **Commit** (the sink's one commit transaction, with the marker row): the row count is checked,
  the staging table is renamed ``_cks_<sink>_p<checkpoint>`` and attached ``FOR VALUES IN
  (<checkpoint>)``: catalog changes, no row copied; the ``CHECK`` constraint spares the attach its
  scan of the rows and is then dropped. The attach builds the partition's copy of each index the
  table has, inside the commit; rows of other checkpoints are not touched, and attaching locks the
  table ``SHARE UPDATE EXCLUSIVE`` only (readers and writers go on).
- **Restore** to N drops the partitions of checkpoints after N (before the rows newer than N are
  deleted, as for every append table).

A retried step attempt stages into its own table (only the attempt ``_metadata`` names is attached,
the others are dropped with the commit); a retried commit finds the marker and does nothing.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.connectors.postgres import seal
from airflow_provider_checkpoint.connectors.postgres import sql as pg
from airflow_provider_checkpoint.connectors.postgres.sql import CHECKPOINT_COLUMN
from airflow_provider_checkpoint.exceptions import SinkSchemaError

if TYPE_CHECKING:
    import psycopg

STAGED_CHECK = "_cks_staged_checkpoint"
"""The ``CHECK (_checkpoint_id = <checkpoint>)`` constraint of a staging table to attach."""


def partition_table(digest: str, checkpoint_id: int) -> str:
    """``_cks_<sink>_p<checkpoint>``: the partition of a committed checkpoint (no staging name matches it)."""
    return f"_cks_{digest}_p{checkpoint_id}"


def _partition_checkpoint(digest: str, name: str) -> int | None:
    """The checkpoint of a name :func:`partition_table` gave, else ``None``."""
    found = re.match(rf"^_cks_{digest}_p([1-9]\d{{0,18}})$", name)
    return int(found.group(1)) if found else None


def check_partitioning(sink: pg.SinkTable, db: psycopg.Connection[Any]) -> None:
    """With ``partition_per_checkpoint``, refuse a table not partitioned ``PARTITION BY LIST
    (_checkpoint_id)``; without it, refuse an append table partitioned so and without a ``DEFAULT``
    partition, whose commit's ``INSERT`` would find no partition for a new checkpoint's rows (a
    completed checkpoint that could never commit)."""
    row = db.execute(
        "SELECT p.partstrat, p.partnatts, a.attname, p.partdefid <> 0 FROM pg_partitioned_table p "
        "LEFT JOIN pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = p.partattrs[0] "
        "WHERE p.partrelid = to_regclass(%s)",
        [f'"{sink.schema}"."{sink.table_name}"'],
    ).fetchone()
    by_checkpoint = row is not None and tuple(row[:3]) == ("l", 1, CHECKPOINT_COLUMN)
    if sink.partition_per_checkpoint and not by_checkpoint:
        raise SinkSchemaError(
            f"sink {sink.uid}: partition_per_checkpoint needs table {sink.target_name()} partitioned "
            f"PARTITION BY LIST ({CHECKPOINT_COLUMN}), and it is "
            f"{'not partitioned' if row is None else 'partitioned otherwise'} (the sink does not change the "
            "structure of an existing table: create it so, or leave partition_per_checkpoint off)"
        )
    if sink.mode == "append" and not sink.partition_per_checkpoint and by_checkpoint and row and not row[3]:
        raise SinkSchemaError(
            f"sink {sink.uid}: table {sink.target_name()} is partitioned PARTITION BY LIST ({CHECKPOINT_COLUMN}) "
            "without a DEFAULT partition, so a commit could not insert a new checkpoint's rows: set "
            "partition_per_checkpoint=True (each checkpoint attached as its partition)"
        )


def create_staging(sink: pg.SinkTable, db: psycopg.Connection[Any], staging: str, checkpoint_id: int) -> None:
    """The staging table of ``checkpoint_id``, ready to be attached as its partition."""
    from psycopg import sql

    column, value = pg.ident(CHECKPOINT_COLUMN), sql.Literal(checkpoint_id)
    db.execute(
        sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING CONSTRAINTS, CONSTRAINT {} CHECK ({} = {}))").format(
            sink.table(staging), sink.table(), pg.ident(STAGED_CHECK), column, value
        )
    )
    db.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET DEFAULT {}").format(sink.table(staging), column, value))


def attach(
    sink: pg.SinkTable, db: psycopg.Connection[Any], checkpoint_id: int, staging: str, expected: int, sealed: str | None
) -> int:
    """Attach ``staging`` (holding the ``expected`` rows, or with ``sealed`` the table its step sealed, unwritten
    since; else refused) as the partition of ``checkpoint_id``, its seal dropped."""
    from psycopg import sql

    seal.check_staged_rows(db, sink.uid, sink.schema, staging, expected, checkpoint_id, sealed)
    seal.unseal(db, sink.schema, staging)
    partition = partition_table(sink.digest, checkpoint_id)
    db.execute(sql.SQL("ALTER TABLE {} RENAME TO {}").format(sink.table(staging), pg.ident(partition)))
    db.execute(
        sql.SQL("ALTER TABLE {} ATTACH PARTITION {} FOR VALUES IN ({})").format(
            sink.table(), sink.table(partition), sql.Literal(checkpoint_id)
        )
    )
    db.execute(
        sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}, ALTER COLUMN {} DROP DEFAULT").format(
            sink.table(partition), pg.ident(STAGED_CHECK), pg.ident(CHECKPOINT_COLUMN)
        )
    )
    return expected


def drop_newer(sink: pg.SinkTable, db: psycopg.Connection[Any], checkpoint_id: int) -> int:
    """Drop the partitions this sink attached for checkpoints after ``checkpoint_id``; how many."""
    from psycopg import sql

    names = db.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%s)",
        [f'"{sink.schema}"."{sink.table_name}"'],
    ).fetchall()
    newer = [n for (n,) in names if (_partition_checkpoint(sink.digest, n) or 0) > checkpoint_id]
    for name in newer:
        db.execute(sql.SQL("DROP TABLE {}").format(sink.table(name)))
    return len(newer)
