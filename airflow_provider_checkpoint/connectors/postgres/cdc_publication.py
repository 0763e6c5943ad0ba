"""The publication of :class:`~.cdc.PostgresCdcSource`: the tables it names (``schema.table``), the publication
created for them or checked to list exactly them, and the check that it lists, at every barrier, the tables
the job's snapshot covered (a table joins only with a snapshot of its own)."""

from __future__ import annotations

import logging
import re
from typing import Any

from airflow_provider_checkpoint.connectors.postgres.cdc_types import quote, quoted_table
from airflow_provider_checkpoint.exceptions import CdcSourceError, PipelineDefinitionError

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")


def qualified(uid: str, table: str) -> str:
    """``table`` as ``schema.name`` (``public`` when it names no schema), lower case; refused unless both are
    unquoted identifiers."""
    parts = table.split(".")
    if len(parts) == 1:
        parts = ["public", *parts]
    if len(parts) != 2 or not all(_NAME.match(p) for p in parts):
        raise PipelineDefinitionError(f"{uid}: {table!r} is not a table name (schema.table, unquoted identifiers)")
    return ".".join(p.lower() for p in parts)


def published(conn: Any, uid: str, publication: str) -> list[str]:
    """The tables publication ``publication`` lists now, sorted (``schema.name``); refused if it has none."""
    rows = conn.execute(
        "SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = %s ORDER BY 1",
        (publication,),
    ).fetchall()
    if not rows:
        raise CdcSourceError(f"source {uid}: publication {publication} does not exist or has no table")
    return sorted(str(r[0]) for r in rows)


def ensure(conn: Any, uid: str, publication: str, tables: list[str] | None) -> None:
    """Create publication ``publication`` for ``tables``, or check an existing one lists exactly them
    (``None``: the publication is the user's, nothing to do)."""
    if tables is None:
        return
    exists = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)).fetchone()
    if not exists:
        conn.execute(f"CREATE PUBLICATION {quote(publication)} FOR TABLE {', '.join(map(quoted_table, tables))}")
        log.info("source %s: created publication %s for %s", uid, publication, ", ".join(tables))
        return
    listed = published(conn, uid, publication)
    if listed != tables:
        raise CdcSourceError(
            f"source {uid}: publication {publication} lists {listed}, not the source's tables {tables}; drop it, "
            "or give the source another publication name"
        )


def check_unchanged(uid: str, now: list[str], captured: list[str], tables: list[str] | None) -> None:
    """Refuse a barrier once the publication lists (``now``) other tables than the snapshot ``captured``, or the
    source names (``tables``) other ones."""
    if now != captured or (tables or now) != captured:
        added, removed = sorted(set(now) - set(captured)), sorted(set(captured) - set(now))
        raise CdcSourceError(
            f"source {uid}: its tables changed since the snapshot (added {added}, removed {removed}): "
            "a table joins only with a snapshot of its own; "
            "capture it with another source (its own slot), or keep the tables as they were"
        )
