"""The connection of :class:`~.sink.PostgresTableSink`: parameters resolved on the driver from an
Airflow ``postgres`` connection, and psycopg connections made from them, on the driver and in the
executors. The password reaches the executors inside the task closure only: :class:`PgConnection`
never shows it in a ``repr``, a log, a message or a document.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.exceptions import SinkConnectionError, SinkUnavailableError

if TYPE_CHECKING:
    import psycopg

CONNECT_TIMEOUT = 10
"""Seconds to wait for the server before a connection attempt fails (unless the connection sets it)."""
_EXTRAS = ("sslmode", "sslcert", "sslkey", "sslrootcert", "connect_timeout", "application_name", "options")
SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
"""libpq's ``sslmode`` values."""
_TRANSIENT = ("starting up", "shutting down", "recovery mode", "too many clients", "remaining connection slots")
"""Server answers at connect time that a retry can get past (other ``FATAL`` answers are refusals)."""


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

    def connect(self, autocommit: bool = False, replication: bool = False) -> psycopg.Connection[Any]:
        """A psycopg connection (``replication``: a logical replication connection, simple queries only).
        The server refusing us (credentials, database) raises
        :class:`SinkConnectionError`; no answer, or a passing state, :class:`SinkUnavailableError`
        (the step is retried). Neither names the password."""
        import psycopg

        kwargs: dict[str, Any] = {"connect_timeout": CONNECT_TIMEOUT, **dict(self.options)}
        if replication:
            kwargs["replication"] = "database"
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
            text = "\n".join(lines)  # the FATAL line may come before a DETAIL line
            refused = "FATAL:" in text and not any(t in text for t in _TRANSIENT)
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
