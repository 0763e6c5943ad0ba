"""The statements of :class:`~.sink.PostgresTableSink`'s commit and restore transactions.

Every function runs inside the caller's transaction (one ``psycopg`` connection, committed on
exit), after the caller locked the sink's claim row, so a commit and a restore of the same
table never interleave.

Undo, by mode:

- ``append``: every row carries the checkpoint that wrote it (``_checkpoint_id``); a restore to
  N deletes the rows of newer checkpoints. Cost: 8 bytes per row, no retention bound needed.
- ``upsert``: before the ``INSERT … ON CONFLICT`` of checkpoint C, the current row of every
  staged key (or ``_undo_existed = false`` for a new key) is copied into the undo table
  ``_cks_<sink>_undo`` under ``_undo_checkpoint = C``; then the keys whose staged row deletes
  them (``delete_when``) are deleted, and the other staged rows upserted. A restore to N puts back, for every key
  changed after N, its before-image from the oldest checkpoint after N. Cost: one row per
  changed key per checkpoint, for the ``undo_checkpoints`` newest commits only.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.connectors.postgres import seal
from airflow_provider_checkpoint.connectors.postgres import sql as pg
from airflow_provider_checkpoint.exceptions import RestoreError

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

    from airflow_provider_checkpoint.core.model import JsonDict

log = logging.getLogger(__name__)

UNDO_CHECKPOINT = "_undo_checkpoint"
MARKER_KEY = ("job_id", "sink_uid", "table_name", "checkpoint_id")
"""A commit marker's primary key: a job's sink marks each checkpoint once per table."""
UNDO_EXISTED = "_undo_existed"


def _exists(db: psycopg.Connection[Any], schema: str, table: str) -> bool:
    found = db.execute("SELECT to_regclass(%s) IS NOT NULL", [f'"{schema}"."{table}"']).fetchone()
    return bool(found and found[0])


def ensure_bookkeeping(sink: pg.SinkTable, db: psycopg.Connection[Any]) -> None:
    """Create the claim and marker tables in the table's schema if absent."""
    from psycopg import sql

    db.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (schema_name text, table_name text, job_id text NOT NULL, sink_uid "
            "text NOT NULL, mode text NOT NULL, keys text[] NOT NULL, PRIMARY KEY (schema_name, table_name))"
        ).format(sink.table(pg.CLAIMS))
    )
    db.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (job_id text, sink_uid text, checkpoint_id bigint, table_name text "
            "NOT NULL, rows bigint NOT NULL, undo_kept boolean NOT NULL, committed_at timestamptz NOT NULL "
            "DEFAULT now(), PRIMARY KEY ({}))"
        ).format(sink.table(pg.MARKERS), pg.idents(list(MARKER_KEY)))
    )


def key_markers_by_table(sink: pg.SinkTable, db: psycopg.Connection[Any]) -> None:
    """Give a markers table created before markers were keyed by table (primary key ``(job_id,
    sink_uid, checkpoint_id)``) the key :data:`MARKER_KEY`, so one job's sink uid can mark the same
    checkpoint committed into two tables of the schema. Its rows stay; a current table: one catalog query."""
    from psycopg import sql

    markers = f'"{sink.schema}"."{pg.MARKERS}"'
    if _primary_key(db, markers) == MARKER_KEY:
        return
    db.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sink.table(pg.MARKERS)))
    old = _primary_key(db, markers)  # again, under the lock: another commit may have done it
    if old == MARKER_KEY:
        return
    name = _first(
        db.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'p'", [markers]
        ).fetchone()
    )
    drop = sql.SQL("DROP CONSTRAINT {}, ").format(sql.Identifier(name)) if name is not None else sql.SQL("")
    db.execute(
        sql.SQL("ALTER TABLE {} {}ADD PRIMARY KEY ({})").format(
            sink.table(pg.MARKERS), drop, pg.idents(list(MARKER_KEY))
        )
    )
    log.info("sink %s: commit markers of schema %s keyed by table (was %s)", sink.uid, sink.schema, list(old))


def _primary_key(db: psycopg.Connection[Any], table: str) -> tuple[str, ...]:
    row = db.execute(
        "SELECT array_agg(a.attname::text ORDER BY k.n) FROM pg_constraint c, unnest(c.conkey) WITH ORDINALITY "
        "k(attnum, n), pg_attribute a WHERE c.conrelid = %s::regclass AND c.contype = 'p' "
        "AND a.attrelid = c.conrelid AND a.attnum = k.attnum",
        [table],
    ).fetchone()
    return tuple(row[0]) if row and row[0] else ()


def move_rows(
    sink: pg.SinkTable,
    db: psycopg.Connection[Any],
    checkpoint_id: int,
    staging: str,
    expected: int,
    columns: list[str],
    sealed: str | None = None,
) -> int:
    """Move the rows of ``staging`` into the table (recording before-images in upsert mode), then drop
    it; refused unless it holds the ``expected`` rows (:func:`~.seal.check_staged_rows`; with the step's seal
    ``sealed``: unless it is the table the step sealed, unwritten since). An append reads the staging table
    once: its ``INSERT``'s row count is also checked."""
    from psycopg import sql

    stg, target = sink.table(staging), sink.table()
    cols = pg.idents(columns)
    if sink.mode == "append":
        if sealed is not None:
            seal.check_staged_rows(db, sink.uid, sink.schema, staging, expected, checkpoint_id, sealed)
        elif not _exists(db, sink.schema, staging):
            seal.refuse_commit(sink.uid, sink.schema, staging, expected, checkpoint_id, "is gone")
        moved = db.execute(
            sql.SQL("INSERT INTO {} ({}, {}) SELECT {}, %s FROM {}").format(
                target, cols, pg.ident(pg.CHECKPOINT_COLUMN), cols, stg
            ),
            [checkpoint_id],
        ).rowcount
        if moved != expected:
            seal.refuse_commit(sink.uid, sink.schema, staging, expected, checkpoint_id, f"holds {moved} rows")
    elif _empty_and_locked(sink, db):  # a first load: every staged key is new, no row to update or delete
        seal.check_staged_rows(db, sink.uid, sink.schema, staging, expected, checkpoint_id, sealed)
        record_empty(sink, db, checkpoint_id, columns)
        db.execute(  # in key order: the unique index grows at its right edge, ≈ 2× faster than in staged order
            sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}{} ORDER BY {}").format(
                target, cols, cols, stg, _kept(sink), pg.idents(sink.keys)
            )
        )
    else:
        seal.check_staged_rows(db, sink.uid, sink.schema, staging, expected, checkpoint_id, sealed)
        _record_before_images(sink, db, checkpoint_id, staging, columns)
        _delete_keys(sink, db, staging)
        others = [c for c in columns if c not in sink.keys]
        action = (
            sql.SQL("DO UPDATE SET ")
            + sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(pg.ident(c)) for c in others)
            if others
            else sql.SQL("DO NOTHING")
        )
        db.execute(
            sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}{} ON CONFLICT ({}) {}").format(
                target, cols, cols, stg, _kept(sink), pg.idents(sink.keys), action
            )
        )
    db.execute(sql.SQL("DROP TABLE {}").format(stg))
    return expected


def record_empty(sink: pg.SinkTable, db: psycopg.Connection[Any], checkpoint_id: int, columns: list[str]) -> None:
    """Upsert: the undo row saying the table (of ``columns``) was empty before ``checkpoint_id``; a restore
    to an earlier checkpoint empties it."""
    from psycopg import sql

    _undo_table(sink, db, columns)
    db.execute(
        sql.SQL("INSERT INTO {} ({}, {}) VALUES (%s, NULL)").format(
            sink.table(pg.undo_table(sink.digest)), pg.ident(UNDO_CHECKPOINT), pg.ident(UNDO_EXISTED)
        ),
        [checkpoint_id],
    )


def _empty_and_locked(sink: pg.SinkTable, db: psycopg.Connection[Any]) -> bool:
    """Whether the table holds no row, and then holds none but this transaction's until it ends: an
    empty table is locked ``SHARE ROW EXCLUSIVE`` (readers go on; no other transaction writes or
    takes this lock until the commit ends, and one that wrote before has finished), then checked
    again. A table with rows is not locked."""
    from psycopg import sql

    empty = sql.SQL("SELECT NOT EXISTS (SELECT FROM {})").format(sink.table())
    if not _first(db.execute(empty).fetchone()):
        return False
    db.execute(sql.SQL("LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE").format(sink.table()))
    return bool(_first(db.execute(empty).fetchone()))


def _first(row: Any) -> Any:
    return row[0] if row else None


def _kept(sink: pg.SinkTable) -> sql.Composable:
    """The ``WHERE`` clause selecting the staged rows that do not delete their key (all without ``delete_when``)."""
    from psycopg import sql

    if sink.delete_when is None:
        return sql.SQL("")
    return sql.SQL(" WHERE NOT coalesce({}, false)").format(pg.ident(sink.delete_when))


def _delete_keys(sink: pg.SinkTable, db: psycopg.Connection[Any], staging: str) -> None:
    """Delete the keys whose staged row's ``delete_when`` is true from the table (one indexed join per
    pattern of null key parts)."""
    from psycopg import sql

    if sink.delete_when is None:
        return
    stg, flag = sink.table(staging), pg.ident(sink.delete_when)
    for nulls in pg.null_patterns(db, stg, sink.keys, flag):
        db.execute(
            sql.SQL("DELETE FROM {} t USING {} s WHERE s.{} AND {} AND {}").format(
                sink.table(),
                stg,
                flag,
                pg.keys_equal(sink.keys, "t", "s", nulls),
                pg.null_filter(sink.keys, nulls, "s"),
            )
        )


def _undo_table(sink: pg.SinkTable, db: psycopg.Connection[Any], columns: list[str]) -> sql.Composable:
    """The undo table, created if absent: the checkpoint, whether the key existed, the table's ``columns``."""
    from psycopg import sql

    undo = sink.table(pg.undo_table(sink.digest))
    db.execute(
        sql.SQL("CREATE TABLE IF NOT EXISTS {} AS SELECT 0::bigint AS {}, false AS {}, {} FROM {} WITH NO DATA").format(
            undo, pg.ident(UNDO_CHECKPOINT), pg.ident(UNDO_EXISTED), pg.idents(columns), sink.table()
        )
    )
    return undo


def _record_before_images(
    sink: pg.SinkTable, db: psycopg.Connection[Any], checkpoint_id: int, staging: str, columns: list[str]
) -> None:
    from psycopg import sql

    undo, target = _undo_table(sink, db, columns), sink.table()
    picked = sql.SQL(", ").join(pg.ident("s" if c in sink.keys else "t", c) for c in columns)
    stg = sink.table(staging)
    for nulls in pg.null_patterns(db, stg, sink.keys):  # one indexed join per pattern of null key parts
        db.execute(
            sql.SQL(
                "INSERT INTO {} ({}, {}, {}) SELECT %s, t.ctid IS NOT NULL, {} FROM {} s LEFT JOIN {} t ON {} WHERE {}"
            ).format(
                undo,
                pg.ident(UNDO_CHECKPOINT),
                pg.ident(UNDO_EXISTED),
                pg.idents(columns),
                picked,
                stg,
                target,
                pg.keys_equal(sink.keys, "t", "s", nulls),
                pg.null_filter(sink.keys, nulls, "s"),
            ),
            [checkpoint_id],
        )


def write_marker(
    sink: pg.SinkTable, db: psycopg.Connection[Any], claim: JsonDict, checkpoint_id: int, rows: int
) -> None:
    """The marker row of the commit; upsert: purge before-images beyond the ``undo_checkpoints`` newest commits."""
    from psycopg import sql

    markers = sink.table(pg.MARKERS)
    owner = [claim["job_id"], claim["sink"], sink.table_name]
    db.execute(
        sql.SQL(
            "INSERT INTO {} (job_id, sink_uid, table_name, checkpoint_id, rows, undo_kept) "
            "VALUES (%s, %s, %s, %s, %s, %s)"
        ).format(markers),
        [*owner, checkpoint_id, rows, sink.mode == "upsert"],
    )
    if sink.mode != "upsert":
        return
    purged = db.execute(
        sql.SQL(
            "UPDATE {m} SET undo_kept = false WHERE job_id = %s AND sink_uid = %s AND table_name = %s AND undo_kept "
            "AND checkpoint_id < ALL (SELECT checkpoint_id FROM {m} WHERE job_id = %s AND sink_uid = %s "
            "AND table_name = %s ORDER BY checkpoint_id DESC LIMIT %s) RETURNING checkpoint_id"
        ).format(m=markers),
        [*owner, *owner, sink.undo_checkpoints],
    ).fetchall()
    if purged:
        db.execute(
            sql.SQL("DELETE FROM {} WHERE {} = ANY(%s)").format(
                sink.table(pg.undo_table(sink.digest)), pg.ident(UNDO_CHECKPOINT)
            ),
            [[p[0] for p in purged]],
        )


def undo_newer(sink: pg.SinkTable, db: psycopg.Connection[Any], claim: JsonDict, checkpoint_id: int) -> list[int]:
    """Undo every committed checkpoint newer than ``checkpoint_id``; their ids (refused if an undo was purged)."""
    from psycopg import sql

    markers, target = sink.table(pg.MARKERS), sink.table()
    owner = [claim["job_id"], claim["sink"], sink.table_name]
    newer = db.execute(
        sql.SQL(
            "SELECT checkpoint_id, undo_kept FROM {} WHERE job_id = %s AND sink_uid = %s AND table_name = %s "
            "AND checkpoint_id > %s ORDER BY checkpoint_id"
        ).format(markers),
        [*owner, checkpoint_id],
    ).fetchall()
    if not newer:
        return []
    if sink.mode == "append":
        db.execute(
            sql.SQL("DELETE FROM {} WHERE {} > %s").format(target, pg.ident(pg.CHECKPOINT_COLUMN)), [checkpoint_id]
        )
    else:
        missing = [c for c, kept in newer if not kept]
        if missing:
            raise RestoreError(
                f"sink {sink.uid}: cannot return {sink.target_name()} to checkpoint {checkpoint_id}: the before-images "
                f"of checkpoints {missing} were purged (undo_checkpoints={sink.undo_checkpoints})"
            )
        _put_back(sink, db, checkpoint_id)
    db.execute(
        sql.SQL("DELETE FROM {} WHERE job_id = %s AND sink_uid = %s AND table_name = %s AND checkpoint_id > %s").format(
            markers
        ),
        [*owner, checkpoint_id],
    )
    return [c for c, _ in newer]


def _put_back(sink: pg.SinkTable, db: psycopg.Connection[Any], checkpoint_id: int) -> None:
    """Return the table to ``checkpoint_id``: put back, for every key a newer checkpoint changed, its
    before-image from the oldest of them. A first load F after ``checkpoint_id`` (the table was empty
    before it: its one undo row has ``_undo_existed`` null) empties the table, and only the
    checkpoints between ``checkpoint_id`` and F are undone, from the empty table."""
    from psycopg import sql

    undo, keys, target = sink.table(pg.undo_table(sink.digest)), pg.idents(sink.keys), sink.table()
    at, existed = pg.ident(UNDO_CHECKPOINT), pg.ident(UNDO_EXISTED)
    columns = pg.idents(list(pg.table_columns(db, sink.schema, sink.table_name)))
    first_load = _first(
        db.execute(
            sql.SQL("SELECT min({}) FROM {} WHERE {} > %s AND {} IS NULL").format(at, undo, at, existed),
            [checkpoint_id],
        ).fetchone()
    )
    images, params = sql.SQL("{} > %s AND {} IS NOT NULL").format(at, existed), [checkpoint_id]
    if first_load is not None:
        images, params = images + sql.SQL(" AND {} < %s").format(at), [checkpoint_id, first_load]
        db.execute(sql.SQL("DELETE FROM {}").format(target))
    else:  # one indexed join per pattern of null key parts
        for nulls in pg.null_patterns(db, undo, sink.keys, images, params):
            db.execute(
                sql.SQL("DELETE FROM {} t USING (SELECT DISTINCT {} FROM {} WHERE {}) u WHERE {}").format(
                    target, keys, undo, images, pg.keys_equal(sink.keys, "t", "u", nulls)
                ),
                params,
            )
    db.execute(
        sql.SQL(
            "INSERT INTO {} ({}) SELECT {} FROM (SELECT DISTINCT ON ({}) * FROM {} WHERE {} ORDER BY {}, {}) f WHERE {}"
        ).format(target, columns, columns, keys, undo, images, keys, at, existed),
        params,
    )
    db.execute(sql.SQL("DELETE FROM {} WHERE {} > %s").format(undo, at), [checkpoint_id])
