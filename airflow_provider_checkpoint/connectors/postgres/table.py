"""The table side of :class:`~.sink.PostgresTableSink` (see there): its target, connection, records and claim."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.connectors.base.sink import TransactionalSink
from airflow_provider_checkpoint.connectors.postgres import claims
from airflow_provider_checkpoint.connectors.postgres import sql as pg
from airflow_provider_checkpoint.connectors.postgres.connection import PgConnection
from airflow_provider_checkpoint.core.model import JsonDict
from airflow_provider_checkpoint.exceptions import CheckpointStorageError

if TYPE_CHECKING:
    import psycopg

    from airflow_provider_checkpoint.dataflow.context import StepContext


class PostgresTableBase(TransactionalSink, pg.SinkTable):
    """The table side of :class:`~.sink.PostgresTableSink` (see there); what the SQL modules need of it is
    :class:`~.sql.SinkTable`'s."""

    conn_id: str

    def targets(self) -> list[str]:
        """``postgres://<conn_id>/<schema>.<table>`` of the table, and of the dead-letter table."""
        tables = [(self.schema, self.table_name), *([self.dead_letters] if self.dead_letters else [])]
        return [f"postgres://{self.conn_id}/{schema}.{name}" for schema, name in tables]

    def target_name(self) -> str:
        return f"{self.schema}.{self.table_name} (connection {self.conn_id})"

    record_kind = "postgres"

    def record_target(self) -> str:
        return f"{self.schema}.{self.table_name}"

    def _dead_letters_uid(self) -> str:
        return f"{self.uid}.dead_letters"

    def staged_records(self, grown: Mapping[str, int]) -> dict[str, JsonDict]:
        """Rows staged (no files, no bytes: a table), and with a dead-letter table the rows refused into it."""
        entry = {"kind": self.record_kind, "target": self.record_target(), "files": None, "bytes": None}
        records = {self.uid: {**entry, "rows": int(grown.get("sink_rows", 0))}}
        if self.dead_letters:
            target = ".".join(self.dead_letters)
            refused = int(grown.get("sink_rows_refused", 0))
            records[self._dead_letters_uid()] = {**entry, "kind": "dead_letters", "target": target, "rows": refused}
        return records

    def _connection(self) -> PgConnection:
        return PgConnection.from_airflow(self.conn_id)

    def _tx(self) -> psycopg.Connection[Any]:
        return self._connection().connect()

    def table(self, name: str | None = None) -> Any:
        """This sink's table, or ``name`` in its schema, as a quoted SQL identifier."""
        return pg.ident(self.schema, name or self.table_name)

    # -- bookkeeping tables and claim -------------------------------------------------
    def claim_document(self, job_id: str) -> JsonDict:
        return {"job_id": job_id, "sink": self.uid, "mode": self.mode, "keys": self.keys}

    def load_claim(self) -> JsonDict | None:
        with self._tx() as db:
            return claims.read(self, db)

    def store_claim(self, claim: JsonDict) -> None:  # :meth:`claim` inserts it itself, then reads the winner
        with self._tx() as db:
            claims.insert(self, db, claim)

    def claim(self, job_id: str) -> None:
        """As :meth:`TransactionalSink.claim`, on one connection: the stored claim read; if none, this job's
        inserted (unless another is there by then: ``ON CONFLICT DO NOTHING``), committed and read again, so
        the claim that won is the one checked."""
        self.bind_job(job_id)
        with self._tx() as db:
            stored = claims.read(self, db)
            if stored is None:
                claims.insert(self, db, self.claim_document(job_id))
                db.commit()
                stored = claims.read(self, db)
        if stored is None:
            raise CheckpointStorageError(f"sink {self.uid}: the claim of {self.target_name()} was not stored")
        self.owned_claim(stored)

    def prepare(self, ctx: StepContext) -> None:
        """Before any Spark work of the step: the connection works, the table is this job's."""
        self.claim(ctx.plan.job_id)
