"""The seal of a staging table: once its step has loaded it, no write reaches it unseen until the commit.

The step's last transaction on a staging table (:func:`seal`) gives it a ``BEFORE INSERT OR UPDATE OR DELETE OR
TRUNCATE … FOR EACH STATEMENT`` trigger, ``ENABLE ALWAYS``, whose function (:data:`FUNCTION`, one per schema)
refuses the statement, and records the seal in the committable: the transaction ids (``xmin``) of the trigger's and
the function's catalog rows and the table's ``relfilenode``. Finalize (before ``_metadata``) and the commit (under
the claim's lock) read them again (:func:`problem`): the same seal means the table holds what the step loaded,
with no row counted.

What this trusts, and why (PostgreSQL's documentation: *CREATE TRIGGER*, *ALTER TABLE*, *System Columns*):

- A statement-level trigger fires once for every ``INSERT``, ``UPDATE``, ``DELETE``, ``MERGE`` action, ``COPY
  FROM`` and ``TRUNCATE`` of the table, also one touching no row; ``ENABLE ALWAYS`` makes it fire under
  ``session_replication_role = replica`` and in a logical replication apply too. So while the seal holds, no
  such statement changes a row.
- Disabling, re-enabling, dropping or re-creating the trigger, or replacing its function, writes a new
  ``pg_trigger`` or ``pg_proc`` row version, whose ``xmin`` is the id of that later transaction: never the seal's.
  ``VACUUM FREEZE`` keeps the ``xmin`` a row was written with (it marks the row frozen).
- A change of rows that no trigger sees rewrites the table into a new file (``ALTER COLUMN … TYPE … USING``; also
  ``VACUUM FULL`` and ``CLUSTER``, which are refused too): a new ``relfilenode``.
- The seal commits after every load transaction of the table (its ``CREATE TRIGGER`` waits for a writer still in
  flight, e.g. a Spark task attempt that lost its executor), so a server that lost transactions (a failover to a
  replica that lagged) lost the seal with them: the table is then refused as unsealed.

Not trusted: ``pg_stat_*`` row counters (asynchronous, reset by ``pg_stat_reset``, lost at a crash), the table's
own ``pg_class.xmin`` (no ``INSERT`` or ``DELETE`` writes it). Not covered: tools that write heap pages beneath SQL
(``pg_surgery``, a data file edited by hand); a row count would see some of those, an ``UPDATE`` it would not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

from airflow_provider_checkpoint.connectors.postgres import sql as pg
from airflow_provider_checkpoint.exceptions import CheckpointStorageError, how_to_restore

if TYPE_CHECKING:
    import psycopg

FUNCTION = "_cks_sealed"
"""The trigger function (in the sink's schema) refusing every write to a sealed staging table; also the trigger."""

_BODY = (
    "BEGIN RAISE EXCEPTION 'staging table %.% is sealed: it holds the rows of a checkpoint that its sink will "
    "commit, and writes to it are refused (drop it, or restore the job, instead)', TG_TABLE_SCHEMA, TG_TABLE_NAME "
    "USING ERRCODE = 'object_not_in_prerequisite_state'; END"
)


def _function(db: psycopg.Connection[Any], schema: str) -> None:
    """Create :data:`FUNCTION` in ``schema`` unless it is there (another step's creation at the same time: kept)."""
    import psycopg
    from psycopg import sql

    name = pg.ident(schema, FUNCTION)
    if db.execute("SELECT to_regprocedure(%s)", [f'"{schema}"."{FUNCTION}"()']).fetchone() != (None,):
        return
    try:
        with db.transaction():
            db.execute(
                sql.SQL("CREATE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS {}").format(name, sql.Literal(_BODY))
            )
    except (psycopg.errors.DuplicateFunction, psycopg.errors.UniqueViolation):
        pass


def current(db: psycopg.Connection[Any], schema: str, table: str) -> str | None:
    """The seal as the catalog holds it now (``None``: no enabled-always seal trigger)."""
    row = db.execute(
        "SELECT t.xmin::text || '/' || p.xmin::text || '/' || c.relfilenode::text FROM pg_class c "
        "JOIN pg_trigger t ON t.tgrelid = c.oid AND t.tgname = %s AND t.tgenabled = 'A' "
        "JOIN pg_proc p ON p.oid = t.tgfoid WHERE c.oid = to_regclass(%s)",
        [FUNCTION, f'"{schema}"."{table}"'],
    ).fetchone()
    return None if row is None else str(row[0])


def seal(db: psycopg.Connection[Any], schema: str, table: str) -> str:
    """Seal ``schema.table`` in the caller's transaction (it waits for a write still in flight) and return the seal
    the committable records: from the commit of that transaction on, every write to the table is refused."""
    from psycopg import sql

    _function(db, schema)
    trigger, target = pg.ident(FUNCTION), pg.ident(schema, table)
    db.execute(
        sql.SQL(
            "CREATE TRIGGER {} BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON {} FOR EACH STATEMENT "
            "EXECUTE FUNCTION {}()"
        ).format(trigger, target, pg.ident(schema, FUNCTION))
    )
    db.execute(sql.SQL("ALTER TABLE {} ENABLE ALWAYS TRIGGER {}").format(target, trigger))
    state = current(db, schema, table)
    assert state is not None
    return state


def problem(db: psycopg.Connection[Any], schema: str, table: str, sealed: str) -> str | None:
    """How ``schema.table`` differs from the table its step sealed with ``sealed``; ``None`` if it is that table,
    unwritten since."""
    if db.execute("SELECT to_regclass(%s)", [f'"{schema}"."{table}"']).fetchone() == (None,):
        return "is gone"
    state = current(db, schema, table)
    if state == sealed:
        return None
    return (
        "has lost its step's seal (its trigger dropped or disabled, or the table made again)"
        if state is None
        else f"was written or rewritten after its step (its seal {state} is not the step's {sealed})"
    )


def unseal(db: psycopg.Connection[Any], schema: str, table: str) -> None:
    """Drop the seal of a staging table the commit keeps (made the table, or attached as a partition)."""
    from psycopg import sql

    db.execute(sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(pg.ident(FUNCTION), pg.ident(schema, table)))


def staged_rows_problem(
    db: psycopg.Connection[Any], schema: str, table: str, expected: int, sealed: str | None = None
) -> str | None:
    """How staging table ``schema.table`` differs from holding the ``expected`` rows its step loaded; ``None`` if
    it holds them. ``sealed``: the step's seal, checked in the catalog instead of counting (:func:`problem`)."""
    from psycopg import sql

    if sealed is not None:
        return problem(db, schema, table, sealed)
    if db.execute("SELECT to_regclass(%s)", [f'"{schema}"."{table}"']).fetchone() == (None,):
        return "is gone"
    counted = db.execute(sql.SQL("SELECT count(*) FROM {}").format(pg.ident(schema, table))).fetchone()
    return None if counted and counted[0] == expected else f"holds {counted and counted[0]} rows"


def check_staged_rows(
    db: psycopg.Connection[Any],
    uid: str,
    schema: str,
    table: str,
    expected: int,
    checkpoint_id: int,
    sealed: str | None = None,
) -> None:
    """Refuse to commit checkpoint ``checkpoint_id`` from staging table ``schema.table`` (:func:`refuse_commit`)
    unless it holds the ``expected`` rows (with ``sealed``: is the table its step sealed, unwritten since)."""
    if found := staged_rows_problem(db, schema, table, expected, sealed):
        refuse_commit(uid, schema, table, expected, checkpoint_id, found)


def refuse_commit(uid: str, schema: str, table: str, expected: int, checkpoint_id: int, found: str) -> NoReturn:
    """The commit of ``checkpoint_id`` refused: its staging table ``schema.table`` ``found`` (is gone,
    or holds another number of rows than the ``expected`` ones). Staging tables are logged, so a crash
    of the server does not empty them, and finalize checks them just before ``_metadata``
    (:meth:`~.sink.PostgresTableSink.verify_staged`): one gone or short now was dropped or changed by
    hand after that (or the database lost committed transactions, e.g. a failover to a replica that
    lagged). The message says how to get the job moving again; raised inside the commit transaction,
    it rolls back whatever the caller moved."""
    raise CheckpointStorageError(
        f"sink {uid}: cannot commit checkpoint {checkpoint_id}: its staging table {schema}.{table} {found}, the "
        f"checkpoint staged {expected} rows there (was it dropped or changed by hand?). Checkpoint {checkpoint_id} "
        "is complete (its _metadata exists), so its finalize and every trigger of the job stop here until it is "
        "moved past: restore the job to an earlier retained checkpoint "
        f"({how_to_restore(f'<an id before {checkpoint_id}>')}): the restore rolls every sink back to it and the next "
        f"run reads the input of checkpoint {checkpoint_id} again (see docs/postgres.md, 'A staging table is gone')"
    )
