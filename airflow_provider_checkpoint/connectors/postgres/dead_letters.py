"""The dead-letter table of a :class:`~.sink.PostgresTableSink`: rows PostgreSQL refused.

With ``dead_letter_table`` set, a row holding a value PostgreSQL refuses (a NUL byte in text, a
number or timestamp out of its column's range, …) is not loaded. The executor that finds it
skips it and stages it as a dead letter in a second staging table of the attempt
(:func:`~.sql.dead_letter_staging`, logged like the first, so it survives a crash of
the server), in the same transaction as its partition's rows.
Finalize moves the dead letters into the dead-letter table in the same transaction that moves
the rows and writes the marker, so each refused row is recorded exactly once; a restore to N
deletes those of the checkpoints it undoes. A checkpoint with more than
``max_refused_fraction`` of its rows refused is declined.

The table (:data:`COLUMNS`) may be shared by several sinks and jobs: rows carry the job, the
sink uid and the checkpoint; ``record`` is the refused row as JSON text.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.connectors.postgres import seal
from airflow_provider_checkpoint.connectors.postgres import sql as pg
from airflow_provider_checkpoint.exceptions import CheckpointStorageError, SinkSchemaError, SinkValueError

if TYPE_CHECKING:
    import psycopg

    from airflow_provider_checkpoint.connectors.postgres.connection import PgConnection
    from airflow_provider_checkpoint.core.model import JsonDict

log = logging.getLogger(__name__)

COLUMNS = (
    ("job_id", "text NOT NULL"),
    ("sink_uid", "text NOT NULL"),
    ("checkpoint_id", "bigint NOT NULL"),
    ("target_table", "text NOT NULL"),
    *((c, "text") for c in pg.DEAD_LETTER_STAGED[:2]),
    *((c, "text NOT NULL") for c in pg.DEAD_LETTER_STAGED[2:]),
    ("committed_at", "timestamptz NOT NULL DEFAULT now()"),
)
"""The dead-letter table: job, sink uid, checkpoint, the sink's table, the refused column, the
row's key (upsert, as JSON), the row (JSON), PostgreSQL's message, when it was committed."""


def prepare(sink: pg.SinkTable, db: psycopg.Connection[Any], table: tuple[str, str], staging: str) -> None:
    """Create the dead-letter ``table`` if absent (refuse one without :data:`COLUMNS`) and the
    attempt's dead-letter staging table beside ``staging``."""
    from psycopg import sql

    schema, name = table
    db.execute(
        sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
            pg.ident(schema, name),
            sql.SQL(", ").join(sql.SQL("{} {}").format(pg.ident(c), sql.SQL(t)) for c, t in COLUMNS),
        )
    )
    present = pg.table_columns(db, schema, name)
    missing = [c for c, _ in COLUMNS if c not in present]
    if missing:
        raise SinkSchemaError(f"sink {sink.uid}: dead-letter table {schema}.{name} has no columns {missing}")
    dead = sink.table(pg.dead_letter_staging(staging))
    db.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(dead))
    columns = sql.SQL(", ").join(sql.SQL("{} text").format(pg.ident(c)) for c in pg.DEAD_LETTER_STAGED)
    db.execute(sql.SQL("CREATE TABLE {} ({})").format(dead, columns))


def check_refused(sink: pg.SinkTable, conn: PgConnection, staging: str, rows: int, refused: int) -> None:
    """After the load: decline the checkpoint if more than ``max_refused_fraction`` of its rows were
    refused, else log how many were (with the first, for a person to act on)."""
    from psycopg import sql

    if not refused:
        return
    with conn.connect() as db:
        first = db.execute(
            sql.SQL("SELECT column_name, key, error FROM {} LIMIT 1").format(
                sink.table(pg.dead_letter_staging(staging))
            )
        ).fetchone()
    example = "" if first is None else f"column {first[0] or '?'}" + (f", key {first[1]}" if first[1] else "")
    example += f": {first[2]}" if first else ""
    if refused > sink.max_refused_fraction * (rows + refused):
        raise SinkValueError(
            f"sink {sink.uid}: PostgreSQL refused {refused} of {rows + refused} rows for {sink.target_name()}, "
            f"more than max_refused_fraction={sink.max_refused_fraction} (the first: {example})"
        )
    log.warning("sink %s: %d rows refused, staged as dead letters (the first: %s)", sink.uid, refused, example)


def move(
    sink: pg.SinkTable,
    db: psycopg.Connection[Any],
    claim: JsonDict,
    checkpoint_id: int,
    staging: str,
    expected: int,
) -> None:
    """Inside the commit transaction: move the ``expected`` dead letters staged with ``staging``
    into the dead-letter table, then drop their staging table."""
    from psycopg import sql

    if not expected:
        return
    if sink.dead_letters is None:
        raise CheckpointStorageError(
            f"sink {sink.uid}: checkpoint {checkpoint_id} staged {expected} dead letters but the sink has no "
            "dead_letter_table any more: set it back to commit them"
        )
    name = pg.dead_letter_staging(staging)
    seal.check_staged_rows(db, sink.uid, sink.schema, name, expected, checkpoint_id)
    dead = sink.table(name)
    staged = pg.idents(list(pg.DEAD_LETTER_STAGED))
    db.execute(
        sql.SQL(
            "INSERT INTO {} (job_id, sink_uid, checkpoint_id, target_table, {}) SELECT %s, %s, %s, %s, {} FROM {}"
        ).format(pg.ident(*sink.dead_letters), staged, staged, dead),
        [claim["job_id"], claim["sink"], checkpoint_id, f"{sink.schema}.{sink.table_name}"],
    )
    db.execute(sql.SQL("DROP TABLE {}").format(dead))


def delete_newer(sink: pg.SinkTable, db: psycopg.Connection[Any], claim: JsonDict, checkpoint_id: int) -> None:
    """Inside the restore transaction: delete the sink's dead letters of checkpoints after ``checkpoint_id``."""
    from psycopg import sql

    if sink.dead_letters is None:
        return
    db.execute(
        sql.SQL("DELETE FROM {} WHERE job_id = %s AND sink_uid = %s AND checkpoint_id > %s").format(
            pg.ident(*sink.dead_letters)
        ),
        [claim["job_id"], claim["sink"], checkpoint_id],
    )
