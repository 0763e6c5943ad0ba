"""The PostgreSQL side of :class:`~.postgres_table.PostgresTableSink`: connection, names, types, bulk load.

Nothing here holds rows in the driver: :func:`copy_partitions` runs in the executors, one
``COPY`` per Arrow batch inside one transaction per partition, and returns one small row
(count, error) per partition. The connection's password reaches the executors inside the
task closure only: :class:`PgConnection` never shows it in a ``repr``, a log or a document.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.exceptions import PipelineDefinitionError, SinkConnectionError, SinkUnavailableError

if TYPE_CHECKING:
    import psycopg
    import pyarrow as pa
    from psycopg import sql
    from pyspark.sql import DataFrame
    from pyspark.sql.types import DataType

CONNECT_TIMEOUT = 10
"""Seconds to wait for the server before a connection attempt fails (unless the connection sets it)."""
_EXTRAS = ("sslmode", "sslcert", "sslkey", "sslrootcert", "connect_timeout", "application_name", "options")
_TRANSIENT = ("starting up", "shutting down", "recovery mode", "too many clients", "remaining connection slots")
"""Server answers at connect time that a retry can get past (other ``FATAL`` answers are refusals)."""
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
CHECKPOINT_COLUMN = "_checkpoint_id"
"""Append mode: the checkpoint that wrote each row (what a restore deletes by)."""
CLAIMS = "checkpoint_sink_claims"
MARKERS = "checkpoint_sink_markers"


@dataclass(frozen=True)
class PgConnection:
    """Connection parameters resolved on the driver from an Airflow ``postgres`` connection."""

    conn_id: str
    host: str
    port: int
    user: str
    dbname: str
    password: str | None = field(default=None, repr=False)
    options: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_airflow(cls, conn_id: str) -> PgConnection:
        """The parameters of Airflow connection ``conn_id`` (through ``PostgresHook``); refused if undefined."""
        from airflow.exceptions import AirflowNotFoundException
        from airflow.providers.postgres.hooks.postgres import PostgresHook

        try:
            conn = PostgresHook(postgres_conn_id=conn_id).connection
        except AirflowNotFoundException as e:
            raise SinkConnectionError(f"Airflow connection {conn_id!r} is not defined") from e
        if conn.conn_type not in ("postgres", "postgresql"):
            raise SinkConnectionError(f"Airflow connection {conn_id!r} has type {conn.conn_type!r}, not 'postgres'")
        extra = conn.extra_dejson
        options = tuple((k, str(extra[k])) for k in _EXTRAS if k in extra)
        return cls(
            conn_id=conn_id,
            host=conn.host or "localhost",
            port=int(conn.port or 5432),
            user=conn.login or "",
            dbname=conn.schema or "postgres",
            password=conn.password,
            options=options,
        )

    def connect(self, autocommit: bool = False) -> psycopg.Connection[Any]:
        """A psycopg connection. The server refusing us (credentials, database) raises
        :class:`SinkConnectionError`; no answer, or a passing state, :class:`SinkUnavailableError`
        (the step is retried). Neither names the password."""
        import psycopg

        kwargs: dict[str, Any] = {"connect_timeout": CONNECT_TIMEOUT, **dict(self.options)}
        try:
            return psycopg.connect(
                host=self.host,
                port=self.port,
                user=self.user,
                password=self.password,
                dbname=self.dbname,
                autocommit=autocommit,
                **kwargs,
            )
        except psycopg.OperationalError as e:
            lines = str(e).replace(self.password or "\0", "***").strip().splitlines()
            message = (
                f"cannot connect to PostgreSQL {self.host}:{self.port}/{self.dbname} as {self.user!r} "
                f"(Airflow connection {self.conn_id!r}): {lines[-1] if lines else type(e).__name__}"
            )
            refused = "FATAL:" in message and not any(t in message for t in _TRANSIENT)
            raise (SinkConnectionError if refused else SinkUnavailableError)(message) from None


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


def staging_pattern(digest: str, checkpoint_id: int | None = None) -> re.Pattern[str]:
    """Names :func:`staging_table` gives for this sink (and ``checkpoint_id``, if given)."""
    checkpoint = r"[1-9]\d{0,18}" if checkpoint_id is None else str(checkpoint_id)
    return re.compile(rf"^_cks_{digest}_c{checkpoint}_[0-9a-f]{{12}}$")


def undo_table(digest: str) -> str:
    return f"_cks_{digest}_undo"


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


def keys_equal(keys: list[str], left: str, right: str) -> sql.Composable:
    from psycopg import sql

    return sql.SQL(" AND ").join(sql.SQL("{} = {}").format(ident(left, k), ident(right, k)) for k in keys)


def _has_nul(value: Any) -> bool:
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return isinstance(value, str) and "\0" in value


def _refusal(error: psycopg.Error, rows: list[dict[str, Any]], sent: int, keys: list[str], partition: int) -> str:
    """The refused column and the key (or row) of a failed ``COPY`` of ``rows``: from the server's
    context, or for a value psycopg refuses itself (a NUL byte in text), the row being sent."""
    found = re.search(r"line (\d+)(?:, column (\w+))?", error.diag.context or "")
    line = int(found.group(1)) if found else sent + 1
    column = found.group(2) if found and found.group(2) else None
    row = rows[line - 1] if 1 <= line <= len(rows) else {}
    if column is None:
        column = next((c for c, v in row.items() if _has_nul(v)), "?")
    where = f"row {line} of a batch of partition {partition}"
    if keys and row:
        where = "key (" + ", ".join(f"{k}={row.get(k)!r}" for k in keys) + ")"
    return f"column {column}, {where}: {(error.diag.message_primary or str(error)).strip()}"


def _as_csv(batch: pa.RecordBatch) -> bytes | None:
    """``batch`` as headerless CSV (Arrow's writer, no Python per row); ``None`` if a column has no CSV form."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    if any(pa.types.is_nested(f.type) or pa.types.is_binary(f.type) for f in batch.schema):
        return None
    out = pa.BufferOutputStream()
    pacsv.write_csv(batch, out, write_options=pacsv.WriteOptions(include_header=False))
    return bytes(out.getvalue())


def _write_rows(cur: psycopg.Cursor[Any], statement: sql.Composed, rows: list[dict[str, Any]]) -> int:
    """``COPY`` of ``rows`` value by value (psycopg adapts arrays, bytes); raises with ``sent`` set on the error."""
    sent = 0
    try:
        with cur.copy(statement) as copy:
            for row in rows:
                copy.write_row(tuple(row.values()))
                sent += 1
    except Exception as e:
        e.sent = sent  # type: ignore[attr-defined]
        raise
    return sent


def one_stream_per_core(df: DataFrame) -> DataFrame:
    """``df`` in at most as many partitions as the session has cores (merged without a shuffle):
    one ``COPY`` stream per core. Each Python task costs a fixed start (worker, connection,
    transaction) that, with more partitions than cores, is paid several times per core. Under
    Spark Connect, where the client does not see the cores, ``df`` as it is."""
    context = getattr(df.sparkSession, "sparkContext", None)
    return df if context is None else df.coalesce(max(int(context.defaultParallelism), 1))


def copy_partitions(
    conn: PgConnection, schema: str, staging: str, columns: list[str], keys: list[str]
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function loading each partition into ``staging`` (one transaction per
    partition); it yields ``(rows, error)``: the rows loaded, or the value PostgreSQL refused.

    A batch goes as CSV written by Arrow where its columns allow, else value by value; a refused
    CSV batch is sent again value by value (then rolled back) to name the exact column and row.
    """

    def load(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import psycopg
        import pyarrow as pa
        from psycopg import sql
        from pyspark import TaskContext

        task = TaskContext.get()
        partition = task.partitionId() if task else 0
        target = sql.SQL("COPY {} ({}) FROM STDIN").format(ident(schema, staging), idents(columns))
        as_csv = target + sql.SQL(" (FORMAT csv)")
        loaded, error = 0, ""
        with conn.connect() as db, db.cursor() as cur:
            for batch in batches:
                batch = batch.select(columns)
                text = _as_csv(batch)
                try:
                    if text is None:
                        _write_rows(cur, target, batch.to_pylist())
                    else:
                        with cur.copy(as_csv) as copy:
                            copy.write(text)
                except psycopg.DataError as e:
                    db.rollback()
                    rows = batch.to_pylist()
                    try:
                        _write_rows(cur, target, rows)
                        failed, sent = e, 0
                    except psycopg.DataError as exact:
                        failed, sent = exact, getattr(exact, "sent", 0)
                    error = _refusal(failed, rows, sent, keys, partition)
                    break
                loaded += batch.num_rows
            if error:
                db.rollback()
            else:
                db.commit()
        yield pa.RecordBatch.from_pydict({"rows": [loaded], "error": [error]})

    return load
