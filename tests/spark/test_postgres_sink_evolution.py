"""``PostgresTableSink(schema_evolution="additive")`` in append mode against a real PostgreSQL server: the
step stages an added and a widened column without changing the table, the commit transaction adds and
widens them with the rows, a restore to before keeps the column; without the option the step refuses,
naming the column and the option. Read back with psycopg against the rows staged."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_checkpoint.connectors.postgres.sink import PostgresTableSink
from airflow_provider_checkpoint.dataflow.graph import Source
from airflow_provider_checkpoint.exceptions import SinkSchemaError
from tests.servers.postgres import PostgresServer
from tests.spark import test_postgres_sink as pg_sink

pytestmark = pytest.mark.spark
target = pg_sink.target  # the fixture: a fresh schema behind connection pg_test
_stage = pg_sink._stage


def _columns(server: PostgresServer, schema: str) -> dict[str, str]:
    with server.connect() as db:
        rows = db.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = %s "
            "AND table_name = 'facts' ORDER BY ordinal_position",
            (schema,),
        ).fetchall()
    return dict(rows)


def _rows(server: PostgresServer, schema: str, columns: str) -> list[tuple[Any, ...]]:
    with server.connect() as db:
        return sorted(db.execute(f"SELECT {columns} FROM {schema}.facts").fetchall())


def test_an_append_commit_adds_and_widens_columns_with_its_rows_and_a_restore_keeps_them(
    spark, postgres_server, target
):
    sink = PostgresTableSink("out", Source("src"), "pg_test", f"{target}.facts", schema_evolution="additive")
    one = [(f"k{i}", i) for i in range(5)]
    sink.commit(1, _stage(spark, sink, "job", 1, one, schema="k string, v int"))
    two = [(f"k{i}", 2**40 + i, None if i % 2 else f"n{i}") for i in range(4)]
    staged = _stage(spark, sink, "job", 2, two, schema="k string, v long, note string")
    assert _columns(postgres_server, target) == {"k": "text", "v": "integer", "_checkpoint_id": "bigint"}
    sink.commit(2, staged)
    sink.commit(2, staged)  # a retry: the marker, nothing twice
    assert _columns(postgres_server, target) == {
        "k": "text", "v": "bigint", "_checkpoint_id": "bigint", "note": "text"
    }  # fmt: skip
    expected = sorted([(k, v, None, 1) for k, v in one] + [(k, v, note, 2) for k, v, note in two])
    assert _rows(postgres_server, target, "k, v, note, _checkpoint_id") == expected

    sink.rollback(1)
    assert "note" in _columns(postgres_server, target), "a restore keeps the column"
    assert _rows(postgres_server, target, "k, v, note, _checkpoint_id") == sorted((k, v, None, 1) for k, v in one)

    strict = PostgresTableSink("out", Source("src"), "pg_test", f"{target}.facts")
    with pytest.raises(SinkSchemaError, match=r"missing columns \['extra'\].*schema_evolution='additive'"):
        _stage(spark, strict, "job", 3, [("a", 1, "n", "e")], schema="k string, v long, note string, extra string")
