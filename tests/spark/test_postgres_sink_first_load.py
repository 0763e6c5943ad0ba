"""A first load into a table the sink makes: the commit makes it of the checkpoint's staging table (no
row copied), once, across a fault inside the commit transaction, restores and later checkpoints; the
rows read back with psycopg and compared with pandas, the table's definition with one the sink creates
in the step (the path for a server without ``NULLS NOT DISTINCT``, or a sink with ``delete_when``)."""

from __future__ import annotations

import tempfile

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.types import StructType

from airflow_provider_checkpoint.connectors.postgres import sql as pg_sql
from airflow_provider_checkpoint.connectors.postgres import staging
from airflow_provider_checkpoint.connectors.postgres import target as pg_target
from airflow_provider_checkpoint.exceptions import InjectedFault, SinkValueError
from airflow_provider_checkpoint.storage import JobStorage
from tests.spark import test_postgres_sink as pg_sink
from tests.spark.helpers import step_context

_rows, _stage, _table, _truth, _exists = pg_sink._rows, pg_sink._stage, pg_sink._table, pg_sink._truth, pg_sink._exists
target = pg_sink.target


def _definition(server, schema: str, table: str) -> tuple[list[tuple[str, str, bool]], list[str]]:
    """Columns (name, type, not null) and index definitions of ``schema.table`` (the name taken out)."""
    with server.connect() as db:
        columns = db.execute(
            "SELECT attname, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            [f"{schema}.{table}"],
        ).fetchall()
        indexes = db.execute(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = %s AND tablename = %s", [schema, table]
        ).fetchall()
    return columns, sorted(i[0].replace(table, "<t>") for i in indexes)


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_the_first_load_makes_the_table_of_its_staging_table_once(spark, postgres_server, target, mode, monkeypatch):
    sink = pg_sink._sink(target, mode)
    one, two = _rows(1, range(0, 30)), _rows(2, range(20, 45))
    staged = _stage(spark, sink, "job", 1, one)
    assert not _exists(postgres_server, target)  # readers see no table until the commit
    index = f'{target}."{staged[0]["staging_table"]}_key"'  # upsert: the step built the key's index
    with postgres_server.connect() as db:
        [(built,)] = db.execute("SELECT to_regclass(%s)::oid", [index]).fetchall()
    assert (built is not None) == (mode == "upsert")
    monkeypatch.setenv("CHECKPOINT_FAULTS", "finalize.inside_sink_commit:checkpoint=1")
    with pytest.raises(InjectedFault):
        sink.commit(1, staged)
    monkeypatch.delenv("CHECKPOINT_FAULTS")
    assert not _exists(postgres_server, target) and not sink.is_committed(1)
    assert pg_sink._staging_tables(postgres_server, target) == [staged[0]["staging_table"]]
    sink.commit(1, staged)
    sink.commit(1, staged)  # a finalize retry: nothing more
    pd.testing.assert_frame_equal(_table(postgres_server, target), _truth(mode, [one]))
    with postgres_server.connect() as db:
        keys = db.execute(
            "SELECT conindid::oid FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'u'",
            [f"{target}.facts"],
        ).fetchall()
    assert keys == ([(built,)] if mode == "upsert" else [])  # the commit attached the step's index, built no other
    assert pg_sink._staging_tables(postgres_server, target) == []

    other = pg_sink._sink(target, mode)  # the table the step creates otherwise, as the oracle of the definition
    other.table_name = "made_in_step"
    with postgres_server.connect() as db:
        pg_target._create(other, db, StructType.fromDDL(pg_sink.SCHEMA))
    assert _definition(postgres_server, target, "facts") == _definition(postgres_server, target, "made_in_step")

    sink.commit(2, _stage(spark, sink, "job", 2, two))
    pd.testing.assert_frame_equal(_table(postgres_server, target), _truth(mode, [one, two]))
    sink.rollback(1)
    pd.testing.assert_frame_equal(_table(postgres_server, target), _truth(mode, [one]))
    sink.rollback(0)  # before the load that made the table: the table stays, empty
    assert _table(postgres_server, target).empty
    sink.commit(3, _stage(spark, sink, "job", 3, two))  # into the empty table: the copying path
    pd.testing.assert_frame_equal(_table(postgres_server, target), _truth(mode, [two]))


NAMES = st.integers(1, 63).flatmap(
    lambda n: st.text("abcxyz_019", min_size=n, max_size=n).filter(lambda name: not name[0].isdigit())
)  # long ones too: the key's name is shortened to 63 bytes


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table=NAMES, keys=st.lists(NAMES, min_size=1, max_size=4, unique=True), taken=st.integers(0, 2))
def test_the_first_loads_key_is_named_as_postgresql_names_a_unique_key(postgres_server, target, table, keys, taken):
    """The name the commit gives the attached key is the one PostgreSQL gives ``UNIQUE (keys)`` in a ``CREATE TABLE``
    (long names shortened, a name taken by another relation of the schema skipped), read back from the catalog."""
    quoted = ", ".join(f'"{k}"' for k in keys)
    with postgres_server.connect() as db, db.transaction(force_rollback=True):
        for name in pg_sql.key_constraint_candidates(table, keys)[:taken]:
            db.execute(f'CREATE TABLE {target}."{name}" ()')
        ours = staging._key_constraint(db, target, table, keys)
        db.execute(
            f'CREATE TABLE {target}."{table}" ({", ".join(f"{q} bigint" for q in quoted.split(", "))}, '
            f"UNIQUE NULLS NOT DISTINCT ({quoted}))"
        )
        [(theirs,)] = db.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass", [f'{target}."{table}"']
        ).fetchall()
    assert ours == theirs


def test_a_key_staged_twice_in_a_first_load_is_refused_by_its_index_in_the_step(spark, postgres_server, target):
    """An input taken as one row per key that repeats one: the step's index build refuses it, naming the key
    (a null key part equal to another, as the table's index compares them); no table is made."""
    sink = pg_sink._sink(target, "upsert")
    rows = _rows(1, range(0, 10))
    storage = JobStorage.for_job(f"{tempfile.gettempdir()}/pg-sink-jobs", "job")
    ctx = step_context(spark, storage, 1, 1)
    sink.prepare(ctx)
    for data, key in (([*rows, rows[3]], "'k3-é✓𝄞'"), ([*rows, (None, *rows[4][1:]), (None, *rows[5][1:])], "None")):
        with pytest.raises(SinkValueError, match=f"upsert key \\(k={key}\\) is staged twice"):
            sink.write(ctx, spark.createDataFrame(data, pg_sink.SCHEMA).repartition(2))
        assert not _exists(postgres_server, target)
