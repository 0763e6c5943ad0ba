"""The rows of :class:`~.sink.PostgresTableSink` that say who writes its table and what it committed: the
claim in ``checkpoint_sink_claims`` (one job, sink uid, mode and keys per table) and each committed
checkpoint's marker in ``checkpoint_sink_markers`` (both created by :func:`~.undo.ensure_bookkeeping`).
A row read here is untrusted: the sink compares a claim with its own (``owned_claim``) before using it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.connectors.postgres import sql as pg
from airflow_provider_checkpoint.connectors.postgres import undo
from airflow_provider_checkpoint.core.model import JsonDict

if TYPE_CHECKING:
    import psycopg


def read(sink: pg.SinkTable, db: psycopg.Connection[Any], lock: bool = False) -> JsonDict | None:
    """The table's stored claim (locked ``FOR UPDATE`` with ``lock``), ``None`` if it has none."""
    from psycopg import sql

    exists = db.execute("SELECT to_regclass(%s) IS NOT NULL", [f'"{sink.schema}"."{pg.CLAIMS}"']).fetchone()
    if not exists or not exists[0]:
        return None
    row = db.execute(
        sql.SQL("SELECT job_id, sink_uid, mode, keys FROM {} WHERE schema_name = %s AND table_name = %s{}").format(
            sink.table(pg.CLAIMS), sql.SQL(" FOR UPDATE" if lock else "")
        ),
        [sink.schema, sink.table_name],
    ).fetchone()
    return None if row is None else {"job_id": row[0], "sink": row[1], "mode": row[2], "keys": list(row[3])}


def insert(sink: pg.SinkTable, db: psycopg.Connection[Any], claim: JsonDict) -> None:
    """Store ``claim`` unless the table has one already (the bookkeeping tables created first)."""
    from psycopg import sql

    undo.ensure_bookkeeping(sink, db)
    db.execute(
        sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING").format(sink.table(pg.CLAIMS)),
        [sink.schema, sink.table_name, claim["job_id"], claim["sink"], claim["mode"], claim["keys"]],
    )


def marker(
    sink: pg.SinkTable, db: psycopg.Connection[Any], claim: JsonDict, checkpoint_id: int, column: str = "rows"
) -> Any:
    """``column`` (``rows``, or the commit's epoch seconds with ``committed_at``) of checkpoint ``checkpoint_id``'s
    marker row for ``claim`` (the sink's own), as a one-value row; ``None``: not committed."""
    from psycopg import sql

    value = sql.SQL("extract(epoch FROM committed_at)::float8" if column == "committed_at" else "rows")
    return db.execute(
        sql.SQL(
            "SELECT {} FROM {} WHERE job_id = %s AND sink_uid = %s AND table_name = %s AND checkpoint_id = %s"
        ).format(value, sink.table(pg.MARKERS)),
        [claim["job_id"], claim["sink"], sink.table_name, checkpoint_id],
    ).fetchone()
