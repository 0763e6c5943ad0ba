"""The PostgreSQL sink's load of one partition (:func:`copy_partitions`) in each of its forms, binary
(pgpq), CSV and value by value, against a real server: drawn rows with every binary-ready type at its
edges, read back with psycopg and compared with the Python values drawn, never with what the load
wrote. The staging column types are drawn too, so a column whose type is not the one its Arrow type
encodes to (``integer`` for a 64-bit column, ``varchar``, ``numeric``) sends the batch as text."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from datetime import date
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_checkpoint.connectors.postgres.connection import PgConnection
from airflow_provider_checkpoint.connectors.postgres.load import as_binary, copy_partitions
from airflow_provider_checkpoint.connectors.postgres.sql import DEAD_LETTER_STAGED
from tests.servers.postgres import PostgresServer

INT16, INT32, INT64 = (st.integers(-(2 ** (b - 1)), 2 ** (b - 1) - 1) for b in (16, 32, 64))
FLOATS = st.floats(allow_nan=True, allow_infinity=True)
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
COLUMNS: dict[str, tuple[pa.DataType, st.SearchStrategy[Any], list[str]]] = {
    "s": (pa.int16(), INT16, ["smallint", "integer"]),
    "i": (pa.int32(), INT32, ["integer", "bigint"]),
    "l": (pa.int64(), INT64, ["bigint", "numeric"]),
    "f": (pa.float32(), FLOATS.map(lambda x: float(np.float32(x)) if math.isfinite(np.float32(x)) else x), ["real"]),
    "d": (pa.float64(), FLOATS, ["double precision"]),
    "b": (pa.bool_(), st.booleans(), ["boolean"]),
    "t": (pa.string(), TEXT, ["text", "character varying"]),
    "y": (pa.binary(), st.binary(max_size=12), ["bytea"]),
    "a": (pa.date32(), st.dates(date(1, 1, 1), date(9999, 12, 31)), ["date"]),
}
_tables = itertools.count()


@pytest.fixture(scope="module")
def load_target(postgres_server: PostgresServer) -> Iterator[tuple[PostgresServer, PgConnection]]:
    """The server, with schema ``copy_forms``, behind Airflow connection ``pg_copy_forms``."""
    with postgres_server.connect() as db:
        db.execute("CREATE SCHEMA copy_forms")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIRFLOW_CONN_PG_COPY_FORMS", postgres_server.uri())
        yield postgres_server, PgConnection.from_airflow("pg_copy_forms")


def _same(column: str, got: Any, want: Any) -> bool:
    if want is None or got is None:
        return got is want
    if column in "fd" and math.isnan(want):
        return math.isnan(got)
    if column == "f":
        return bool(np.float32(got) == np.float32(want))
    return bool(got == want) if column != "y" else bytes(got) == want


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_form_loads_exactly_the_rows_drawn_or_refuses_a_nul_and_loads_none(
    load_target: tuple[PostgresServer, PgConnection], data: st.DataObject
) -> None:
    """Without a dead-letter table a NUL fails the partition and loads nothing; with one, each row holding a NUL
    goes there and every other row is loaded, in order, whichever batch of the ``COPY`` it is in."""
    server, conn = load_target
    exact = data.draw(st.booleans(), label="every type exact (binary)")
    types = {c: t[0] if exact else data.draw(st.sampled_from(t), label=c) for c, (_, _, t) in COLUMNS.items()}
    rows = data.draw(
        st.lists(st.fixed_dictionaries({c: st.none() | v for c, (_, v, _) in COLUMNS.items()}), max_size=30),
        label="rows",
    )
    for i in data.draw(st.sets(st.integers(0, len(rows) - 1), max_size=3) if rows else st.just(set()), label="NUL"):
        rows[i] = {**rows[i], "t": "a\0b"}  # refused wherever it is, in any form
    cuts = sorted(data.draw(st.lists(st.integers(0, len(rows)), max_size=4), label="batch cuts"))
    letters = data.draw(st.booleans(), label="dead letters")
    schema = pa.schema([(c, t) for c, (t, _, _) in COLUMNS.items()])
    bounds = zip([0, *cuts], [*cuts, len(rows)], strict=True)
    batches = [pa.RecordBatch.from_pylist(rows[a:b], schema) for a, b in bounds]
    table = f"t{next(_tables)}"
    with server.connect() as db:
        db.execute(f"CREATE TABLE copy_forms.{table} ({', '.join(f'{c} {t}' for c, t in types.items())}, n serial)")
        db.execute(f"CREATE TABLE copy_forms.{table}_dl ({', '.join(f'{c} text' for c in DEAD_LETTER_STAGED)})")
    load = copy_partitions(conn, "copy_forms", table, types, [], f"{table}_dl" if letters else None)
    [result] = [b.to_pylist() for b in load(iter(batches))][0]
    with server.connect() as db:
        got = db.execute(f"SELECT {', '.join(COLUMNS)} FROM copy_forms.{table} ORDER BY n").fetchall()
        refused = db.execute(f"SELECT record FROM copy_forms.{table}_dl").fetchall()
    nul = [i for i, r in enumerate(rows) if r["t"] is not None and "\0" in r["t"]]
    if nul and not letters:
        assert "NUL" in result["error"] and got == [], (result, got)
        return
    kept = [r for i, r in enumerate(rows) if i not in nul]
    assert result == {"rows": len(kept), "refused": len(nul), "error": ""}
    assert len(got) == len(kept) and len(refused) == len(nul)
    for n, (back, row) in enumerate(zip(got, kept, strict=True)):
        for column, value in zip(COLUMNS, back, strict=True):
            assert _same(column, value, row[column]), (n, column, value, row[column], types)


def test_the_binary_form_is_taken_only_where_every_type_matches_exactly() -> None:
    schema = pa.schema([(c, t) for c, (t, _, _) in COLUMNS.items()])
    batch = schema.empty_table().to_batches(max_chunksize=1) or [pa.RecordBatch.from_pylist([], schema)]
    exact = {c: t[0] for c, (_, _, t) in COLUMNS.items()}
    assert as_binary([batch[0]], exact) is not None
    for column, (_, _, choices) in COLUMNS.items():
        for other in choices[1:]:
            assert as_binary([batch[0]], {**exact, column: other}) is None, (column, other)
    zoned = pa.RecordBatch.from_pylist([], pa.schema([("ts", pa.timestamp("us", "UTC"))]))
    assert as_binary([zoned], {"ts": "timestamp with time zone"}) is None
