"""The PostgreSQL side of :class:`~.sink.PostgresTableSink`: connection, names, types, bulk load.

Nothing here holds rows in the driver: :func:`copy_partitions` runs in the executors, one
``COPY`` per Arrow batch inside one transaction per partition, and returns one small row
(counts, error) per partition. The connection's password reaches the executors inside the
task closure only: :class:`PgConnection` never shows it in a ``repr``, a log or a document.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from airflow_provider_checkpoint.exceptions import PipelineDefinitionError, SinkConnectionError, SinkUnavailableError

if TYPE_CHECKING:
    import psycopg
    import pyarrow as pa
    from psycopg import sql
    from pyspark.sql import DataFrame
    from pyspark.sql.types import DataType


class SinkTable(Protocol):
    """What the undo log and the dead-letter table need of a :class:`~.sink.PostgresTableSink`."""

    uid: str
    schema: str
    table_name: str
    mode: str
    keys: list[str]
    digest: str
    undo_checkpoints: int
    dead_letters: tuple[str, str] | None
    max_refused_fraction: float

    def target_name(self) -> str: ...

    def table(self, name: str | None = None) -> Any: ...


CONNECT_TIMEOUT = 10
"""Seconds to wait for the server before a connection attempt fails (unless the connection sets it)."""
_EXTRAS = ("sslmode", "sslcert", "sslkey", "sslrootcert", "connect_timeout", "application_name", "options")
SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
"""libpq's ``sslmode`` values."""
_TRANSIENT = ("starting up", "shutting down", "recovery mode", "too many clients", "remaining connection slots")
"""Server answers at connect time that a retry can get past (other ``FATAL`` answers are refusals)."""
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
CHECKPOINT_COLUMN = "_checkpoint_id"
NULLS_NOT_DISTINCT_SINCE = 150000
"""PostgreSQL 15: unique indexes may match null values (``NULLS NOT DISTINCT``)."""
"""Append mode: the checkpoint that wrote each row (what a restore deletes by)."""
CLAIMS = "checkpoint_sink_claims"
MARKERS = "checkpoint_sink_markers"
DEAD_LETTER_SUFFIX = "_dl"
DEAD_LETTER_STAGED = ("column_name", "key", "record", "error")
"""The columns of a dead-letter staging table (all ``text``), as :meth:`Refusal.dead_letter` makes them."""


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
        """The parameters of Airflow connection ``conn_id`` (through ``PostgresHook``).

        Refused with :class:`SinkConnectionError` if undefined, of another type, or with an extra
        psycopg would reject (:func:`_checked_extra`), before any connection is tried.
        """
        from airflow.exceptions import AirflowNotFoundException
        from airflow.providers.postgres.hooks.postgres import PostgresHook

        try:
            conn = PostgresHook(postgres_conn_id=conn_id).connection
        except AirflowNotFoundException as e:
            raise SinkConnectionError(f"Airflow connection {conn_id!r} is not defined") from e
        if conn.conn_type not in ("postgres", "postgresql"):
            raise SinkConnectionError(f"Airflow connection {conn_id!r} has type {conn.conn_type!r}, not 'postgres'")
        extra = conn.extra_dejson
        options = tuple((k, _checked_extra(conn_id, k, extra[k])) for k in _EXTRAS if k in extra)
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


def _checked_extra(conn_id: str, name: str, value: Any) -> str:
    """The extra ``name`` as psycopg takes it, else :class:`SinkConnectionError` naming the connection,
    the extra and the rule, never the value (an extra may hold a secret): ``connect_timeout`` a
    positive integer of seconds, ``sslmode`` one of :data:`SSL_MODES`, the others strings without NUL."""
    text = str(value) if type(value) is int else value
    if name == "connect_timeout":
        ok = isinstance(text, str) and text.isascii() and text.isdigit() and int(text) > 0
        rule = "a positive integer of seconds"
    elif name == "sslmode":
        ok = text in SSL_MODES
        rule = f"one of {', '.join(SSL_MODES)}"
    else:
        ok = isinstance(value, str) and "\0" not in value
        rule = "a string without NUL"
    if not ok:
        raise SinkConnectionError(f"Airflow connection {conn_id!r}: extra {name} must be {rule}")
    return str(text)


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


def _nul_column(row: dict[str, Any]) -> str | None:
    """The first column of ``row`` whose value holds a NUL byte (PostgreSQL text cannot), if any."""
    return next((c for c, v in row.items() if _has_nul(v)), None)


def _has_nul(value: Any) -> bool:
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return isinstance(value, str) and "\0" in value


NUL_REFUSED = "a NUL byte (0x00) in text, which PostgreSQL cannot store"


@dataclass(frozen=True)
class Refusal:
    """A row PostgreSQL refused: its index in the rows sent (``None``: not told), column, message."""

    index: int | None
    column: str | None
    message: str

    @classmethod
    def of_server(cls, error: psycopg.Error, count: int) -> Refusal:
        """From a failed value-by-value ``COPY`` of ``count`` rows: the line and column in the
        server's context (``None`` where it does not say, as from a server in another language)."""
        found = re.search(r"line (\d+)(?:, column (\w+))?", error.diag.context or "")
        index = int(found.group(1)) - 1 if found else None
        return cls(
            index if index is not None and 0 <= index < count else None,
            found.group(2) if found else None,
            (error.diag.message_primary or str(error)).strip(),
        )

    def describe(self, row: dict[str, Any], keys: list[str], partition: int) -> str:
        """The refused column and the key (or row number) of ``row``, and the message."""
        where = f"partition {partition}" if self.index is None else f"row {self.index + 1} of partition {partition}"
        if keys and row:
            where = "key (" + ", ".join(f"{k}={row.get(k)!r}" for k in keys) + ")"
        return f"column {self.column or '?'}, {where}: {self.message}"

    def dead_letter(self, row: dict[str, Any], keys: list[str]) -> tuple[str | None, ...]:
        """:data:`DEAD_LETTER_STAGED` of ``row``: key and row as JSON text (a NUL byte escaped as ``\\u0000``)."""
        key = json.dumps({k: row[k] for k in keys}, default=_json_value, ensure_ascii=False) if keys else None
        return self.column, key, json.dumps(row, default=_json_value, ensure_ascii=False), self.message


def _json_value(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return "\\x" + bytes(value).hex()
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def _as_csv(batch: pa.RecordBatch) -> bytes | None:
    """``batch`` as headerless CSV (Arrow's writer, no Python per row); ``None`` if a column has no CSV form."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    if any(pa.types.is_nested(f.type) or pa.types.is_binary(f.type) for f in batch.schema):
        return None
    out = pa.BufferOutputStream()
    pacsv.write_csv(batch, out, write_options=pacsv.WriteOptions(include_header=False))
    return bytes(out.getvalue())


def _write_rows(cur: psycopg.Cursor[Any], statement: sql.Composed, rows: list[Any]) -> None:
    """``COPY`` of ``rows`` (dicts or tuples) value by value: psycopg adapts arrays and bytes."""
    with cur.copy(statement) as copy:
        for row in rows:
            copy.write_row(tuple(row.values()) if isinstance(row, dict) else row)


ROW_BY_ROW_CHUNK = 1000
"""Rows per ``COPY`` when a refused batch is sent again value by value: each refused row costs
at most two ``COPY`` of this many rows."""


def _load_skipping_refused(
    cur: psycopg.Cursor[Any], statement: sql.Composed, rows: list[dict[str, Any]]
) -> Iterator[Refusal]:
    """Load ``rows`` value by value, each chunk under a savepoint, skipping every row PostgreSQL
    refuses, and yield a :class:`Refusal` for each: first the rows holding a NUL byte (psycopg
    refuses them before the server sees the rows sent ahead of them, so they are found before
    sending), then the rows the server refuses, by the line it names. Where the server does not
    name one, the refusal has no index and nothing more is loaded."""
    import psycopg

    nul = {i: column for i, row in enumerate(rows) if (column := _nul_column(row))}
    for index, column in nul.items():
        yield Refusal(index, column, NUL_REFUSED)
    rest = [i for i in range(len(rows)) if i not in nul]
    start = 0
    while start < len(rest):
        chunk = rest[start : start + ROW_BY_ROW_CHUNK]
        refused: Refusal | None = None
        try:
            with cur.connection.transaction():
                _write_rows(cur, statement, [rows[i] for i in chunk])
        except psycopg.DataError as e:
            refused = Refusal.of_server(e, len(chunk))
        if refused is None:
            start += len(chunk)
            continue
        if refused.index is None:
            yield refused
            return
        if refused.index:
            with cur.connection.transaction():
                _write_rows(cur, statement, [rows[i] for i in chunk[: refused.index]])
        yield Refusal(chunk[refused.index], refused.column, refused.message)
        start += refused.index + 1


def one_stream_per_core(df: DataFrame) -> DataFrame:
    """``df`` in at most as many partitions as the session has cores (merged without a shuffle):
    one ``COPY`` stream per core. Each Python task costs a fixed start (worker, connection,
    transaction) that, with more partitions than cores, is paid several times per core. Under
    Spark Connect, where the client does not see the cores, ``df`` as it is."""
    context = getattr(df.sparkSession, "sparkContext", None)
    return df if context is None else df.coalesce(max(int(context.defaultParallelism), 1))


LOAD_RESULT = "rows long, refused long, error string"
"""What :func:`copy_partitions` yields per partition."""


def copy_partitions(
    conn: PgConnection, schema: str, staging: str, columns: list[str], keys: list[str], dead_letters: str | None
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function loading each partition into ``staging`` in one transaction; it
    yields :data:`LOAD_RESULT`: the rows loaded, the rows refused, and the first refusal (column,
    key, message) that fails the partition (its transaction rolled back).

    A batch goes as CSV written by Arrow where its columns allow, else value by value, under a
    savepoint. A refused batch is sent again value by value to find the refused rows: without
    ``dead_letters`` the first one fails the partition; with it (a staging table of
    :data:`DEAD_LETTER_STAGED` columns) each refused row is skipped and staged there as a dead
    letter (:meth:`Refusal.dead_letter`), in the same transaction.
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
        loaded, letters, error = 0, [], ""
        with conn.connect(autocommit=True) as db, db.cursor() as cur, db.transaction():
            for batch in batches:
                batch = batch.select(columns)
                text = _as_csv(batch)
                try:
                    with db.transaction():
                        if text is None:
                            _write_rows(cur, target, batch.to_pylist())
                        else:
                            with cur.copy(as_csv) as copy:
                                copy.write(text)
                    loaded += batch.num_rows
                    continue
                except psycopg.DataError:
                    rows = batch.to_pylist()
                loaded += len(rows)
                for refused in _load_skipping_refused(cur, target, rows):
                    row = rows[refused.index] if refused.index is not None else {}
                    if dead_letters is None or refused.index is None:
                        error = refused.describe(row, keys, partition)
                        break
                    letters.append(refused.dead_letter(row, keys))
                if error:
                    break
            if error:
                raise psycopg.Rollback()
            if letters:
                staged = sql.SQL("COPY {} ({}) FROM STDIN").format(
                    ident(schema, str(dead_letters)), idents(list(DEAD_LETTER_STAGED))
                )
                _write_rows(cur, staged, letters)
        yield pa.RecordBatch.from_pydict({"rows": [loaded - len(letters)], "refused": [len(letters)], "error": [error]})

    return load
