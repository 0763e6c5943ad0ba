"""Model-based suite for every sink (issue #30 point 5): seeded keyed change streams, faults and
restores against Parquet, Delta and PostgreSQL sinks in append and upsert mode (upsert with
``sequence_by`` also with deletes, ``delete_when``, and with soft deletes, ``deletes="soft"``, whose marking
column the readers read too; PostgreSQL with its dead-letter table, and with its input held on the driver
as a source that read it there hands it, ``-driver``), each
table read after every step by independent readers (pyarrow; delta-rs and DuckDB; psycopg) and
compared with the plain-Python model in ``sink_model``.

CI runs the fixed seeds below, two examples each (three in ``make test-full``); ``SINK_MODEL_ALL=1``
adds PostgreSQL with soft deletes (both paths), its append from the driver, and an upsert and an append fed a
DataFrame whose row count the step knows (``-collected``: into the driver, then its ``COPY``);
``SINK_MODEL_SEEDS=1,2,3``, ``SINK_MODEL_EXAMPLES`` and
``SINK_MODEL_STEPS`` change them, ``SINK_MODEL_SHRINK=0`` skips shrinking a failure and
``SINK_MODEL_SHRINK_SECONDS`` (default 60) bounds it, and
``scripts/soak.py --seeds N`` runs many more.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import ci_or_full
from tests.servers.postgres import PostgresServer
from tests.spark.sink_machine import Env, run
from tests.spark.sink_model import DELETE, POISON, Config, Model, scratch_root, sort_rows

pytestmark = pytest.mark.spark

CONFIGS = [
    Config("parquet", "append"),
    Config("parquet", "upsert"),
    Config("parquet", "upsert", sequence_by=True, deletes=True),
    Config("delta", "append"),
    Config("delta", "upsert"),
    Config("delta", "upsert", sequence_by=True, deletes=True),
    Config("postgres", "append"),
    Config("postgres", "append", partition_per_checkpoint=True),
    Config("postgres", "upsert"),
    Config("postgres", "upsert", sequence_by=True, deletes=True),
    Config("postgres", "upsert", sequence_by=True, deletes=True, driver=True),
    Config("parquet", "upsert", deletes=True, soft_column="__deleted"),
    Config("delta", "upsert", sequence_by=True, deletes=True, soft_column="__deleted"),
]
if os.environ.get(
    "SINK_MODEL_ALL"
):  # soft deletes into PostgreSQL run in CI through CDC (test_postgres_cdc_chunk_restart)
    CONFIGS.append(Config("postgres", "upsert", deletes=True, soft_column="deleted"))
    CONFIGS.append(Config("postgres", "upsert", deletes=True, soft_column="deleted", driver=True))
    CONFIGS.append(Config("postgres", "append", driver=True))
    CONFIGS.append(Config("postgres", "upsert", sequence_by=True, deletes=True, collected=True))
    CONFIGS.append(Config("postgres", "append", partition_per_checkpoint=True, collected=True))
SEEDS = [int(s) for s in os.environ.get("SINK_MODEL_SEEDS", "30").split(",")]
EXAMPLES = int(ci_or_full("SINK_MODEL_EXAMPLES", "2", "3"))
STEPS = int(os.environ.get("SINK_MODEL_STEPS", "8"))
SHRINK = os.environ.get("SINK_MODEL_SHRINK", "1") != "0"
SHRINK_SECONDS = int(os.environ.get("SINK_MODEL_SHRINK_SECONDS", "60"))


@pytest.fixture(scope="module")
def env(spark: Any) -> Iterator[Env]:
    yield Env(spark, scratch_root())


@pytest.fixture
def pg_env(env: Env, postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> Env:
    monkeypatch.setenv("AIRFLOW_CONN_PG_MODEL", postgres_server.uri())
    return Env(env.spark, env.root, postgres_server)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
def test_sink_matches_the_model(config: Config, seed: int, request: pytest.FixtureRequest) -> None:
    env = request.getfixturevalue("pg_env" if config.kind == "postgres" else "env")
    run(config, env, seed, EXAMPLES, STEPS, SHRINK, SHRINK_SECONDS)


def test_the_model_is_the_documented_rule() -> None:
    """The model itself, on hand-made input (no Spark): what the suite holds every sink to."""
    upsert, by_seq = Model(Config("delta", "upsert")), Model(Config("delta", "upsert", sequence_by=True))
    batch = [("a", 0, 2, "first"), (None, 0, 0, "null"), ("", 0, 0, "empty"), ("a", 0, 1, "later"), ("a", 0, 1, "tie")]
    for model in (upsert, by_seq):
        model.commit(1, batch + [("", 0, 0, "empty")])
    assert upsert.expected() == sort_rows([("a", 0, 1, "tie"), (None, 0, 0, "null"), ("", 0, 0, "empty")])
    assert by_seq.expected() == sort_rows([("a", 0, 2, "first"), (None, 0, 0, "null"), ("", 0, 0, "empty")])
    upsert.commit(2, [("a", 0, 0, "replaced")])
    upsert.commit(3, [("b", None, 0, "new")])
    upsert.restore(2)
    assert upsert.expected() == sort_rows([("a", 0, 0, "replaced"), (None, 0, 0, "null"), ("", 0, 0, "empty")])
    assert upsert.timeline == [1, 2]

    append, parquet_upsert = Model(Config("parquet", "append")), Model(Config("parquet", "upsert"))
    for model in (append, parquet_upsert):
        model.commit(1, [("a", 0, 0, "x"), ("a", 0, 0, "x")])
        model.commit(2, [("a", 0, 0, "y")])
        model.restore(1)
    assert append.expected() == [("a", 0, 0, "x"), ("a", 0, 0, "x")]
    assert parquet_upsert.expected() == [("a", 0, 0, "y")]  # left as it is: replay converges it

    deletes = Model(Config("delta", "upsert", sequence_by=True, deletes=True))
    deletes.commit(1, [("a", 0, 0, "x"), ("b", 0, 0, "y"), ("c", 0, 0, "z")])
    deletes.commit(
        2, [("a", 0, 5, DELETE), ("a", 0, 4, "older"), ("b", 0, 1, DELETE), ("b", 0, 2, "back"), ("d", 0, 0, DELETE)]
    )
    assert deletes.expected() == [("b", 0, 2, "back"), ("c", 0, 0, "z")]  # a delete competes by sequence_by
    deletes.commit(3, [("c", 0, -1, DELETE)])  # a later checkpoint wins whatever its sequence_by
    assert deletes.expected() == [("b", 0, 2, "back")]
    deletes.restore(1)
    assert deletes.expected() == [("a", 0, 0, "x"), ("b", 0, 0, "y"), ("c", 0, 0, "z")]

    soft = Model(Config("delta", "upsert", deletes=True, soft_column="__deleted"))
    soft.commit(1, [("a", 0, 0, "x"), ("b", 0, 0, "y")])
    soft.commit(2, [("a", 0, 0, DELETE), ("c", 0, 0, DELETE), ("b", 0, 1, DELETE), ("b", 0, 2, "kept")])
    assert soft.expected() == sort_rows(
        [("a", 0, 0, DELETE, True), ("b", 0, 2, "kept", False), ("c", 0, 0, DELETE, True)]
    )
    soft.commit(3, [("a", 0, 1, "revived")])  # a later row of a deleted key revives it
    assert soft.expected()[0] == ("a", 0, 1, "revived", False)

    pg = Model(Config("postgres", "upsert"))
    pg.commit(1, [("a", 0, 0, "x")])
    pg.commit(2, [("a", 0, 0, POISON), ("b", 0, 0, "y")])
    assert pg.expected() == [("a", 0, 0, "x"), ("b", 0, 0, "y")] and pg.expected_dead() == [(2, ("a", 0, 0, POISON))]
    pg.restore(1)
    assert pg.expected() == [("a", 0, 0, "x")] and pg.expected_dead() == []
