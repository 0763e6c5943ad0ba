"""PostgresTableSink without a server: names, committable validation, types, connection refusals."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import Any

import pytest
from pyspark.sql import types as T

from airflow_provider_checkpoint.connectors.postgres import sql as pg
from airflow_provider_checkpoint.connectors.postgres.connection import PgConnection
from airflow_provider_checkpoint.connectors.postgres.sink import PostgresTableSink
from airflow_provider_checkpoint.dataflow.graph import Source
from airflow_provider_checkpoint.exceptions import (
    DocumentError,
    PipelineDefinitionError,
    SinkConnectionError,
    SinkUnavailableError,
)


def _sink(uid: str = "out", table: str = "marts.facts", **kwargs: Any) -> PostgresTableSink:
    return PostgresTableSink(uid, Source("src"), "pg_unit", table, **kwargs)


def test_staging_names_are_unique_per_attempt_short_and_match_only_their_sink_and_checkpoint():
    sink = _sink()
    names = {pg.staging_table(sink.digest, 7, f"job/step/attempt-{n}") for n in range(1, 4)}
    assert len(names) == 3
    assert all(len(n.encode()) <= 63 and pg.staging_pattern(sink.digest, 7).match(n) for n in names)
    name = names.pop()
    assert pg.staging_pattern(sink.digest).match(name)
    assert not pg.staging_pattern(sink.digest, 8).match(name)
    assert not pg.staging_pattern(_sink("other").digest, 7).match(name)
    assert not pg.staging_pattern(_sink(table="marts.other").digest, 7).match(name)
    assert pg.staged_checkpoint(name) == pg.staged_checkpoint(pg.dead_letter_staging(name)) == 7
    with pytest.raises(ValueError):
        pg.staged_checkpoint("facts")


def test_committables_are_read_back_only_in_the_shape_the_step_writes():
    sink = _sink()
    name = pg.staging_table(sink.digest, 3, "job/step/attempt-1")
    good = [{"checkpoint_id": 3, "staging_table": name, "rows": 12}]
    assert sink.read_committables(3, good, "doc") == [(name, 12, 0, None)]  # staged before seals: counted
    assert sink.read_committables(3, [{**good[0], "dead_letters": 2}], "doc") == [(name, 12, 2, None)]
    sealed = {**good[0], "seal": "812/745/16390"}
    assert sink.read_committables(3, [sealed], "doc") == [(name, 12, 0, "812/745/16390")]
    forged = {
        "another checkpoint": [{**good[0], "checkpoint_id": 2}],
        "a table of the user": [{**good[0], "staging_table": "facts"}],
        "another sink's staging": [{**good[0], "staging_table": pg.staging_table(_sink("x").digest, 3, "a")}],
        "an injection": [{**good[0], "staging_table": name + '"; DROP TABLE facts; --'}],
        "a negative count": [{**good[0], "rows": -1}],
        "a negative dead-letter count": [{**good[0], "dead_letters": -1}],
        "a table twice": good * 2,
        "a seal not the catalog's": [{**good[0], "seal": "1/2/3'; DROP TABLE facts; --"}],
        "a seal of another type": [{**good[0], "seal": 812}],
        "not a list": good[0],
    }
    for why, committables in forged.items():
        with pytest.raises(DocumentError):
            sink.read_committables(3, committables, f"doc ({why})")


@pytest.mark.parametrize(
    ("spark_type", "expected"),
    [
        (T.StringType(), "text"),
        (T.LongType(), "bigint"),
        (T.ByteType(), "smallint"),
        (T.DecimalType(20, 4), "numeric(20,4)"),
        (T.TimestampType(), "timestamp with time zone"),
        (T.TimestampNTZType(), "timestamp without time zone"),
        (T.ArrayType(T.DoubleType()), "double precision[]"),
        (T.BinaryType(), "bytea"),
    ],
)
def test_spark_types_map_to_postgres(spark_type, expected):
    assert pg.pg_type("out", "c", spark_type) == expected


def test_types_without_a_mapping_and_bad_definitions_are_refused():
    for unmapped in (T.MapType(T.StringType(), T.LongType()), T.ArrayType(T.ArrayType(T.LongType()))):
        with pytest.raises(PipelineDefinitionError, match="column 'c' has Spark type"):
            pg.pg_type("out", "c", unmapped)
    with pytest.raises(PipelineDefinitionError, match="schema.name"):
        _sink(table='a.b.c"')
    with pytest.raises(PipelineDefinitionError, match="upsert mode needs keys"):
        _sink(mode="upsert")
    with pytest.raises(PipelineDefinitionError, match="not plain PostgreSQL identifiers"):
        _sink(mode="upsert", keys=["k; drop"])
    assert (_sink(table="facts").schema, _sink(table="facts").table_name) == ("public", "facts")
    with pytest.raises(PipelineDefinitionError, match="dead-letter table cannot be the table itself"):
        _sink(dead_letter_table="facts")
    with pytest.raises(PipelineDefinitionError, match=r"max_refused_fraction must be in \[0, 1\]"):
        _sink(dead_letter_table="refused", max_refused_fraction=1.5)
    assert _sink(dead_letter_table="refused").describe()["dead_letters"] == "marts.refused"
    assert _sink(partition_per_checkpoint=True).describe()["partition_per_checkpoint"] is True
    assert "partition_per_checkpoint" not in _sink().describe()
    assert _sink(dead_letter_table="ops.refused").dead_letters == ("ops", "refused")
    for name in ("driver_rows", "driver_bytes"):
        for bad in (-1, True, 1.5):
            with pytest.raises(PipelineDefinitionError, match=f"{name} must be an int >= 0"):
                _sink(**{name: bad})
    assert _sink().takes_source_rows() and not _sink(driver_rows=0).takes_source_rows()


def test_a_dataframe_is_collected_only_with_its_count_known_small_and_its_estimate_small() -> None:
    """Spark's estimate is asked for only once the count allows the collect (no job is run for either)."""
    sink, asked = _sink(driver_rows=10, driver_bytes=100), []

    def size(estimate: int | None) -> Callable[[], int | None]:
        return lambda: asked.append(estimate) or estimate

    assert sink._collects(10, size(100)) and sink._collects(0, size(0))
    assert not sink._collects(10, size(101)) and not sink._collects(10, size(None))
    asked.clear()
    assert not sink._collects(None, size(1)) and not sink._collects(11, size(1)) and asked == []
    assert not _sink(driver_rows=0)._collects(0, size(0)) and not _sink(driver_bytes=0)._collects(1, size(0))


def test_only_keys_compared_as_their_values_skip_the_servers_duplicate_key_check():
    """Rows reduced on the driver are one per key as Arrow compares them: so are they in the server only for key
    types whose equality is the values' own, not ``character(n)`` (trailing blanks ignored), a rounded timestamp
    precision or ``citext``."""
    from airflow_provider_checkpoint.connectors.postgres.target import keys_exact

    sink = _sink(mode="upsert", keys=["a", "b"])
    exact = ["text", "bigint", "numeric(10,2)", "character varying(8)", "timestamp with time zone", "date", "bytea"]
    for kind in exact:
        assert keys_exact(sink, {"a": kind, "b": "integer", "v": "citext"}), kind
    for kind in ["character(3)", "citext", "timestamp(3) with time zone", "real", "jsonb"]:
        assert not keys_exact(sink, {"a": "text", "b": kind}), kind


def test_a_missing_connection_or_another_type_is_refused(monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_PG_UNIT", raising=False)
    with pytest.raises(SinkConnectionError, match="'pg_unit' is not defined"):
        _sink().load_claim()
    monkeypatch.setenv("AIRFLOW_CONN_PG_UNIT", "mysql://u:p@127.0.0.1:3306/db")
    with pytest.raises(SinkConnectionError, match="type 'mysql', not 'postgres'"):
        _sink().load_claim()


def test_an_unreachable_server_is_refused_naming_it_but_not_the_password(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    monkeypatch.setenv("AIRFLOW_CONN_PG_UNIT", f"postgres://u:s3cret-pw@127.0.0.1:{port}/db")
    with pytest.raises(SinkUnavailableError, match=f"127.0.0.1:{port}/db as 'u'") as refused:
        _sink().load_claim()
    assert "s3cret-pw" not in str(refused.value)
    connection = PgConnection.from_airflow("pg_unit")
    assert connection.password == "s3cret-pw" and "s3cret-pw" not in repr(connection)


SECRET = "planted-pg-secret-5b1e"


@pytest.mark.parametrize(
    ("extra", "rule"),
    [
        ({"connect_timeout": "abc"}, "connect_timeout must be a positive integer of seconds"),
        ({"connect_timeout": 0}, "connect_timeout must be a positive integer of seconds"),
        ({"sslmode": "bogus"}, "sslmode must be one of disable, allow, prefer, require, verify-ca, verify-full"),
        ({"application_name": f"a\0{SECRET}"}, "application_name must be a string without NUL"),
        ({"options": 42}, "options must be a string without NUL"),
    ],
    ids=["timeout not a number", "timeout zero", "unknown sslmode", "NUL in a string", "not a string"],
)
def test_a_bad_connection_extra_is_refused_naming_it_never_a_secret(monkeypatch, caplog, extra, rule):
    """Through Airflow's own connection loading (``AIRFLOW_CONN_*``), before psycopg sees anything."""
    conn = {"conn_type": "postgres", "host": "127.0.0.1", "login": "u", "password": SECRET, "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_PG_UNIT", json.dumps(conn))
    with pytest.raises(SinkConnectionError, match=f"Airflow connection 'pg_unit': extra {rule}") as refused:
        PgConnection.from_airflow("pg_unit")
    assert SECRET not in str(refused.value) and SECRET not in caplog.text


def test_good_connection_extras_reach_psycopg_as_strings(monkeypatch):
    extra = {"connect_timeout": 7, "sslmode": "verify-full", "application_name": "etl", "unrelated": "kept out"}
    monkeypatch.setenv("AIRFLOW_CONN_PG_UNIT", json.dumps({"conn_type": "postgres", "host": "h", "extra": extra}))
    options = dict(PgConnection.from_airflow("pg_unit").options)
    assert options == {"connect_timeout": "7", "sslmode": "verify-full", "application_name": "etl"}


def test_the_stats_record_names_the_table_and_its_dead_letters_without_the_connection():
    grown = {"sink_rows": 5, "sink_rows_refused": 2, "sink_files_staged": 3}  # files: another sink's
    entry = {"kind": "postgres", "target": "marts.facts", "rows": 5, "files": None, "bytes": None}
    assert _sink().staged_records(grown) == {"out": entry}
    assert _sink(dead_letter_table="ops.refused").staged_records(grown) == {
        "out": entry,
        "out.dead_letters": {**entry, "kind": "dead_letters", "target": "ops.refused", "rows": 2},
    }
