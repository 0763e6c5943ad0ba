"""PostgresTableSink upsert: an input that may repeat a key is staged unreduced first, and again reduced
to one row per key only when the staging shows a key twice or a refused row; the table read back with
psycopg equals the pandas rule (the greatest ``sequence_by``, then the later row in source order)."""

from __future__ import annotations

import logging
import tempfile
from typing import Any

import pandas as pd
import pytest

from airflow_provider_checkpoint.connectors.postgres.sink import PostgresTableSink
from airflow_provider_checkpoint.dataflow.graph import Source
from airflow_provider_checkpoint.storage import JobStorage
from tests.servers.postgres import PostgresServer
from tests.spark.helpers import step_context

RESTAGED = "staging it again reduced"
SMALLINT_OUT_OF_RANGE = 70000


def _load(spark: Any, sink: PostgresTableSink, checkpoint_id: int, rows: pd.DataFrame) -> list[dict[str, Any]]:
    """Stage ``rows`` in their order (one partition after another: source order is the list's) and commit."""
    storage = JobStorage.for_job(f"{tempfile.gettempdir()}/pg-unreduced-jobs", "job")
    df = spark.createDataFrame([tuple(r) for r in rows.itertuples(index=False)], "k string, v long, seq long")
    ctx = step_context(spark, storage, checkpoint_id)
    sink.prepare(ctx)
    committables = sink.stage(ctx, df)
    sink.commit(checkpoint_id, committables)
    return committables


def _truth(rows: pd.DataFrame, sequence_by: bool) -> pd.DataFrame:
    order = rows.assign(pos=range(len(rows))).sort_values(["seq", "pos"] if sequence_by else ["pos"], kind="stable")
    return order.drop_duplicates("k", keep="last")[["k", "v", "seq"]]


def _table(server: PostgresServer, schema: str) -> pd.DataFrame:
    with server.connect() as db:
        found = db.execute(f"SELECT k, v, seq FROM {schema}.narrow").fetchall()
    return pd.DataFrame(found, columns=["k", "v", "seq"]).sort_values("k").reset_index(drop=True)


CASES = {
    "unique keys: staged once": (
        [("a", 1, 5), ("b", 2, 4), ("c", 3, 3), ("d", 4, 2)], False, False),
    "a key twice: the later row": (
        [("a", 1, 9), ("b", 2, 1), ("a", 3, 2), ("c", 4, 0), ("b", 5, 0)], False, True),
    "a key twice: the greater sequence_by": (
        [("a", 1, 9), ("b", 2, 1), ("a", 3, 2), ("c", 4, 0), ("b", 5, 0)], True, True),
    "a refused value in a row the reduction drops": (
        [("a", SMALLINT_OUT_OF_RANGE, 1), ("b", 2, 1), ("a", 3, 2)], False, True),
}  # fmt: skip
"""rows ``(k, v, seq)`` in source order, whether the sink orders by ``seq``, whether it must stage again."""


@pytest.mark.parametrize("case", list(CASES))
def test_an_upsert_input_is_staged_unreduced_only_when_that_changes_nothing(
    spark, postgres_server, pg_schema, caplog, case
):
    data, sequence_by, restaged = CASES[case]
    with postgres_server.connect() as db:
        db.execute(f"CREATE TABLE {pg_schema}.narrow (k text PRIMARY KEY, v smallint, seq bigint)")
    sink = PostgresTableSink(
        "narrow", Source("src"), "pg_test", f"{pg_schema}.narrow", "upsert", keys=["k"],
        sequence_by=["seq"] if sequence_by else None,
    )  # fmt: skip
    rows = pd.DataFrame(data, columns=["k", "v", "seq"])
    truth = _truth(rows, sequence_by)
    with caplog.at_level(logging.INFO, logger="airflow_provider_checkpoint.connectors.postgres.sink"):
        committables = _load(spark, sink, 1, rows)
    assert committables[0]["rows"] == len(truth)
    assert (RESTAGED in caplog.text) == restaged
    pd.testing.assert_frame_equal(_table(postgres_server, pg_schema), truth.sort_values("k").reset_index(drop=True))
    later = pd.DataFrame([("b", 20, 0), ("e", 21, 0), ("b", 22, 0)], columns=["k", "v", "seq"])  # into rows
    _load(spark, sink, 2, later)
    both = _truth(pd.concat([truth, _truth(later, sequence_by)]), sequence_by=False)
    pd.testing.assert_frame_equal(_table(postgres_server, pg_schema), both.sort_values("k").reset_index(drop=True))


def test_a_refused_winner_goes_to_the_dead_letters_and_an_older_row_of_its_key_does_not_stand(
    spark, postgres_server, pg_schema
):
    """Unreduced, the older row of ``a`` would stage and its refused later row go to the dead letters:
    the table would hold a row the rule replaced. Reduced first, ``a`` is refused and absent."""
    with postgres_server.connect() as db:
        db.execute(f"CREATE TABLE {pg_schema}.narrow (k text PRIMARY KEY, v smallint, seq bigint)")
    sink = PostgresTableSink(
        "narrow", Source("src"), "pg_test", f"{pg_schema}.narrow", "upsert", keys=["k"], dead_letter_table="dead"
    )
    rows = pd.DataFrame([("a", 1, 0), ("b", 2, 0), ("a", SMALLINT_OUT_OF_RANGE, 0)], columns=["k", "v", "seq"])
    committables = _load(spark, sink, 1, rows)
    assert (committables[0]["rows"], committables[0]["dead_letters"]) == (1, 1)
    pd.testing.assert_frame_equal(
        _table(postgres_server, pg_schema), pd.DataFrame([("b", 2, 0)], columns=["k", "v", "seq"])
    )
