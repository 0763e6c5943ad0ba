"""The staging tables of :class:`~.sink.PostgresTableSink`: the step's load into one (driver side; the
executors' part is :mod:`.load`), the committables naming them, their check before ``_metadata``, and
finding and dropping them.

A staging table is ordinary and WAL-logged (never ``UNLOGGED``, which crash recovery empties): once
the step's load has committed, what ``_metadata`` will name survives a crash of the server. A name
read back from a stored document is used only if it matches the sink's pattern for its checkpoint
(:func:`~.sql.staging_pattern`), so a forged committable cannot make the sink read or drop another table.
"""

from __future__ import annotations

import logging
import re
import time
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.connectors.base.upsert_rule import check_delete_column
from airflow_provider_checkpoint.connectors.postgres import dead_letters, seal, target, undo
from airflow_provider_checkpoint.connectors.postgres import sql as pg
from airflow_provider_checkpoint.connectors.postgres.load import (
    LOAD_RESULT,
    copy_partitions,
    from_driver,
    one_stream_per_core,
)
from airflow_provider_checkpoint.connectors.postgres.sql import CHECKPOINT_COLUMN
from airflow_provider_checkpoint.core.documents import Fields
from airflow_provider_checkpoint.core.model import JsonDict
from airflow_provider_checkpoint.exceptions import (
    CheckpointStorageError,
    DocumentError,
    SinkSchemaError,
    SinkValueError,
)

if TYPE_CHECKING:
    import psycopg
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from airflow_provider_checkpoint.connectors.postgres.connection import PgConnection
    from airflow_provider_checkpoint.dataflow.context import StepContext

log = logging.getLogger(__name__)


def check_names(uid: str, schema: StructType) -> None:
    """Refuse input columns that are not plain identifiers, or one named ``_checkpoint_id``."""
    columns = [f.name for f in schema.fields]
    pg.check_identifiers(uid, "columns", columns)
    if CHECKPOINT_COLUMN in columns:
        raise SinkSchemaError(f"sink {uid}: the input must not have a column named {CHECKPOINT_COLUMN}")


def stage(
    sink: pg.SinkTable,
    conn: PgConnection,
    ctx: StepContext,
    schema: StructType,
    rows: DataFrame | pa.Table,
    one_per_key: bool,
    reduced: bool = False,
) -> JsonDict | None:
    """Stage ``rows`` of Spark columns ``schema`` for ``sink`` (a DataFrame: from the executors; Arrow held
    on the driver: from there, no Spark job), return the committable. One driver connection makes the staging
    table and, after the load, seals it (and builds the first load's key index) in one transaction. With
    ``one_per_key`` false (an upsert input that may repeat a key), ``None`` if a key is staged twice or a row was
    refused: the caller stages again. ``reduced``: Arrow rows one per key by the driver's reduction, so keys of
    exact types are checked there (:func:`~.target.check_reduced`), not in the server."""
    started = time.monotonic()
    staging = pg.staging_table(sink.digest, ctx.checkpoint_id, ctx.attempt_tag)
    check_names(sink.uid, schema)
    check_delete_column(sink.uid, sink.delete_when, schema)
    dead = pg.dead_letter_staging(staging) if sink.dead_letters else None
    with conn.connect() as db:
        born = target.born_in_commit(sink, db)  # then the commit makes the table of the staging table
        types = target.new_types(sink, schema) if born else target.check_target(sink, db, schema)
        null_keys = sink.mode == "upsert" and (born or bool(target.unique_index(sink, db)))
        target.create_staging(sink, db, staging, types, ctx.checkpoint_id)
        if sink.dead_letters:
            dead_letters.prepare(sink, db, sink.dead_letters, staging)
        db.commit()
        return _load(sink, conn, db, ctx, staging, types, rows, one_per_key, reduced, null_keys, born, dead, started)


def _load(
    sink: pg.SinkTable,
    conn: PgConnection,
    db: psycopg.Connection[Any],
    ctx: StepContext,
    staging: str,
    types: dict[str, str],
    rows: DataFrame | pa.Table,
    one_per_key: bool,
    reduced: bool,
    null_keys: bool,
    born: bool,
    dead: str | None,
    started: float,
) -> JsonDict | None:
    """:func:`stage` after ``staging`` is made: the load, the checks, the seal on ``db`` (:func:`_seal`)."""
    import pyarrow as pa

    held = rows if isinstance(rows, pa.Table) else None
    load = copy_partitions(conn, sink.schema, staging, types, sink.keys, dead)
    if isinstance(rows, pa.Table):  # held on the driver: streams from here, no Spark job, no Python worker
        results: list[Any] = from_driver(load, rows)
    else:
        results = one_stream_per_core(rows).mapInArrow(load, LOAD_RESULT).collect()
    failed = [r["error"] for r in results if r["error"]]
    rows, refused = sum(int(r["rows"]) for r in results), sum(int(r["refused"]) for r in results)
    # the first load's table: its unique index built now (the commit attaches it), which refuses a key staged twice
    keyed = born and sink.mode == "upsert" and not failed and (one_per_key or not refused)
    indexed = time.monotonic()
    sealed = _seal(sink, db, staging, rows, counted=held is None, index=True) if keyed else None
    twice, indexed = keyed and sealed is None, time.monotonic() - indexed
    if twice and held is None:  # a partition loaded twice, not the input, repeats the key: the step is retried
        _check_count(sink, staging, _count(sink, db, staging), rows)
    if not one_per_key and (
        failed or refused or (twice if keyed else target.staged_twice(sink, conn, staging, null_keys, analyze=not born))
    ):
        log.info(
            "sink %s: input staged unreduced has %s; staging it again reduced to one row per key",
            sink.uid, "refused rows" if failed or refused else "a key twice",
        )  # fmt: skip
        return None
    if failed:
        raise SinkValueError(f"sink {sink.uid}: PostgreSQL refused a value for {sink.target_name()}: {failed[0]}")
    dead_letters.check_refused(sink, conn, staging, rows, refused)
    if twice:  # the input repeats the key (the rows staged are the rows loaded): named, nulls equal as in the index
        target.staged_twice(sink, conn, staging, null_keys, refuse=True, analyze=False)
        raise SinkValueError(f"sink {sink.uid}: an upsert key is staged twice in this checkpoint")
    # keyed: the index holds each key once; a null key part is a key value in the table the commit makes
    if not keyed and reduced and held is not None and target.keys_exact(sink, types):
        target.check_reduced(sink, conn, staging, held, null_keys, analyze=not born)
    elif not keyed and one_per_key:
        target.check_staged(sink, conn, staging, null_keys, analyze=not born)
    sealed = sealed if keyed else _seal(sink, db, staging, rows, counted=held is None)
    assert sealed is not None
    ctx.add_metric("sink_rows", rows)
    committable: JsonDict = {"checkpoint_id": ctx.checkpoint_id, "staging_table": staging, "rows": rows, "seal": sealed}
    if dead:
        ctx.add_metric("sink_rows_refused", refused)
        committable["dead_letters"] = refused
    log.info(
        "sink %s: staged %d rows%s into %s.%s from %s in %.2fs%s",
        sink.uid, rows, f" (and {refused} refused rows as dead letters)" if refused else "", sink.schema,
        staging, "the driver" if held is not None else f"{len(results)} partitions", time.monotonic() - started,
        f" (its key index and seal {indexed:.2f}s)" if keyed else "",
    )  # fmt: skip
    return committable


def _seal(
    sink: pg.SinkTable, db: psycopg.Connection[Any], staging: str, rows: int, counted: bool, index: bool = False
) -> str | None:
    """Seal ``staging`` in one transaction on ``db`` (:mod:`.seal`: finalize and the commit then check it in the
    catalog, counting no row) and return the seal. With ``index`` (the first load's upsert table) the unique key
    index is built in that transaction too (:func:`index_keys`): ``None``, nothing built nor sealed, if a key is
    staged twice. With ``counted`` (rows loaded by Spark tasks) the table is counted once, under the seal: a task
    attempt can commit its load and be lost before it reports it, and its retry (or a speculative copy) load that
    partition again; a table holding other than the ``rows`` reported is refused and the step fails (its retry
    stages again); with ``index`` no count: such a partition stages its keys twice, which the index refuses (then
    :func:`_load` counts the table, telling that from an input repeating a key). Rows from the driver need no
    count: its streams are not retried, each reports what it committed."""
    import psycopg

    try:
        with db.transaction():
            sealed = seal.seal(db, sink.schema, staging)
            if index:
                index_keys(sink, db, staging)
            found = _count(sink, db, staging) if counted and not index else None
    except psycopg.errors.UniqueViolation:
        if not index:
            raise
        return None  # the transaction rolled back: no index, no seal
    if found is not None:
        _check_count(sink, staging, found, rows)
    return sealed


def _count(sink: pg.SinkTable, db: psycopg.Connection[Any], staging: str) -> int:
    from psycopg import sql

    found = db.execute(sql.SQL("SELECT count(*) FROM {}").format(sink.table(staging))).fetchone()
    return int(found[0]) if found else 0


def _check_count(sink: pg.SinkTable, staging: str, found: int, rows: int) -> None:
    """Refuse a staging table of Spark-loaded rows holding other than the ``rows`` its tasks reported."""
    if found != rows:
        raise CheckpointStorageError(
            f"sink {sink.uid}: staging table {sink.schema}.{staging} holds {found} rows, its load reported {rows} "
            "(a Spark task's partition loaded twice by a retried or speculative attempt): the step fails, and its "
            "retry stages the checkpoint again"
        )


INDEX_MEMORY_KB = 256 * 1024
"""``maintenance_work_mem`` (kB) the first load's unique index is built with at least, for that transaction only
(``SET LOCAL``; a higher server setting stands): the sort of 1,000,000 keys in memory, in up to
``max_parallel_maintenance_workers`` workers (PostgreSQL gives each at least 32 MB of it): ≈ 0.85 of the time
with the default 64 MB on keys in no order (docs/benchmarks.md). Used only as the sort needs it, freed at the
commit."""


def _index_memory(db: psycopg.Connection[Any]) -> None:
    """:data:`INDEX_MEMORY_KB` for this transaction's index build (``SET LOCAL``)."""
    db.execute(
        "SELECT set_config('maintenance_work_mem', greatest(pg_size_bytes(current_setting('maintenance_work_mem'))"
        " / 1024, %s)::text || 'kB', true)",
        [INDEX_MEMORY_KB],
    )


def index_keys(sink: pg.SinkTable, db: psycopg.Connection[Any], staging: str) -> None:
    """Build, in the caller's transaction, the unique ``NULLS NOT DISTINCT`` index on the keys of upsert staging
    table ``staging`` that a first load makes the table of (:func:`~.sql.staged_key_index`; :func:`take_over`
    attaches it as the table's key): ``psycopg.errors.UniqueViolation`` if a key is staged twice (null key parts
    equal)."""
    from psycopg import sql

    _index_memory(db)
    db.execute(
        sql.SQL("CREATE UNIQUE INDEX {} ON {} ({}) NULLS NOT DISTINCT").format(
            pg.ident(pg.staged_key_index(staging)), sink.table(staging), pg.idents(sink.keys)
        )
    )


def _key_constraint(db: psycopg.Connection[Any], schema: str, table: str, keys: list[str]) -> str:
    """The name PostgreSQL gives ``ALTER TABLE table ADD UNIQUE (keys)``: the first of
    :func:`~.sql.key_constraint_candidates` no relation or constraint of ``schema`` has."""
    candidates = pg.key_constraint_candidates(table, keys)
    taken = {
        r[0]
        for r in db.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = to_regnamespace(%s) AND relname = ANY(%s) "
            "UNION SELECT conname FROM pg_constraint WHERE connamespace = to_regnamespace(%s) AND conname = ANY(%s)",
            [f'"{schema}"', candidates, f'"{schema}"', candidates],
        ).fetchall()
    }
    free = [c for c in candidates if c not in taken]
    if not free:
        raise CheckpointStorageError(f"no free name for the unique key of {schema}.{table} among {candidates}")
    return free[0]


def take_over(
    sink: pg.SinkTable, db: psycopg.Connection[Any], checkpoint_id: int, name: str, expected: int, sealed: str | None
) -> int:
    """In the commit transaction of the first load into a table the sink makes (:func:`~.target.born_in_commit`):
    staging table ``name``, refused unless it holds the ``expected`` rows (with ``sealed``: unless it is the table
    its step sealed, unwritten since), becomes the table, as the sink creates it: its seal dropped, renamed, then
    append: ``_checkpoint_id`` added, ``NOT NULL``, the checkpoint's in every row (a catalog change); upsert: its
    ``UNIQUE NULLS NOT DISTINCT`` key, named as PostgreSQL names it (the index the step built, :func:`index_keys`,
    attached: a catalog change; built now from the rows if the step found the table there and built none), and
    the undo row saying the table was empty before. No row is copied; readers see no table until the commit, then
    the checkpoint's rows. The rows moved."""
    from psycopg import sql

    seal.check_staged_rows(db, sink.uid, sink.schema, name, expected, checkpoint_id, sealed)
    seal.unseal(db, sink.schema, name)
    index = pg.staged_key_index(name)
    built = sink.mode == "upsert" and db.execute("SELECT to_regclass(%s)", [f'"{sink.schema}"."{index}"']).fetchone()
    db.execute(sql.SQL("ALTER TABLE {} RENAME TO {}").format(sink.table(name), pg.ident(sink.table_name)))
    if sink.mode == "append":
        column = pg.ident(CHECKPOINT_COLUMN)
        db.execute(
            sql.SQL("ALTER TABLE {} ADD COLUMN {} bigint NOT NULL DEFAULT {}").format(
                sink.table(), column, sql.Literal(checkpoint_id)
            )
        )
        db.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN {} DROP DEFAULT").format(sink.table(), column))
    else:
        key = pg.ident(_key_constraint(db, sink.schema, sink.table_name, sink.keys))
        if built and built[0] is not None:
            db.execute(
                sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} UNIQUE USING INDEX {}").format(
                    sink.table(), key, pg.ident(index)
                )
            )
        else:
            _index_memory(db)
            db.execute(
                sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} UNIQUE NULLS NOT DISTINCT ({})").format(
                    sink.table(), key, pg.idents(sink.keys)
                )
            )
        undo.record_empty(sink, db, checkpoint_id, list(pg.table_columns(db, sink.schema, sink.table_name)))
    log.info("sink %s: made %s of staging table %s (%d rows)", sink.uid, sink.target_name(), name, expected)
    return expected


Staged = tuple[str, int, int, str | None]
"""A committable as read back: staging table, rows, dead letters, the step's seal (``None``: staged unsealed, by
an earlier version: its rows are counted)."""
_SEAL = re.compile(r"^[0-9]{1,10}/[0-9]{1,10}/[0-9]{1,10}$")


def read_committables(sink: pg.SinkTable, checkpoint_id: int, committables: Any, document: str) -> list[Staged]:
    """:data:`Staged` committables: each table named by the sink's pattern for ``checkpoint_id``."""
    pattern = pg.staging_pattern(sink.digest, checkpoint_id)
    reader = Fields({"committables": committables}, document)
    staged: list[Staged] = []
    for i, item in enumerate(reader.items("committables")):
        c = Fields(item, document, f"committables[{i}]")
        if c.integer("checkpoint_id", 1) != checkpoint_id:
            raise c.error("checkpoint_id", f"must be {checkpoint_id}", c.raw["checkpoint_id"])
        name = c.raw.get("staging_table")
        if not isinstance(name, str) or not pattern.match(name):
            raise c.error("staging_table", f"must be a staging table of sink {sink.uid} for this checkpoint", name)
        sealed = c.raw.get("seal")
        if sealed is not None and not (isinstance(sealed, str) and _SEAL.match(sealed)):
            raise c.error("seal", "must be a staging table's seal", sealed)
        staged.append((name, c.integer("rows", 0), c.integer("dead_letters", default=0), sealed))
    if len({s[0] for s in staged}) != len(staged):
        raise DocumentError(document, "committables", "name a staging table twice")
    return staged


def verify(sink: pg.SinkTable, db: psycopg.Connection[Any], checkpoint_id: int, staged: list[Staged]) -> None:
    """Each staging table still holds the rows the step staged (is the table the step sealed, unwritten since: no
    row counted), else :class:`CheckpointStorageError`."""
    for name, expected, _, sealed in staged:
        if found := seal.staged_rows_problem(db, sink.schema, name, expected, sealed):
            raise CheckpointStorageError(
                f"sink {sink.uid}: staging table {sink.schema}.{name} of checkpoint {checkpoint_id} "
                f"{found}, the step staged {expected} rows there; the checkpoint is aborted and the "
                "next one reads its input again"
            )


def tables(sink: pg.SinkTable, db: psycopg.Connection[Any], checkpoint_id: int | None = None) -> list[str]:
    """The sink's staging tables (and their dead letters' ones) present, of ``checkpoint_id`` or of all."""
    names = db.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = %s AND starts_with(tablename, %s)",
        [sink.schema, f"_cks_{sink.digest}_c"],
    ).fetchall()
    pattern = pg.staging_pattern(sink.digest, checkpoint_id, dead_letters=True)
    return sorted(n[0] for n in names if pattern.match(n[0]))


def drop(sink: pg.SinkTable, db: psycopg.Connection[Any], names: list[str]) -> int:
    """Drop the staging tables ``names`` (as :func:`tables` lists them); how many."""
    from psycopg import sql

    for name in names:
        db.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sink.table(name)))
    return len(names)
