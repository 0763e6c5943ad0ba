from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local SparkSession for the whole test session (it takes seconds to start)."""
    from airflow_provider_checkpoint.spark.session import get_spark

    yield get_spark(master="local[2]")


@pytest.fixture(autouse=True)
def _provider_settings_kept(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that changes the shared session's SQL settings puts them back. ``conf.unset`` does not: it
    falls back to Spark's default, not the provider's (``spark.sql.shuffle.partitions`` 200, not 8), and
    every later test on the worker ran with it (an oracle test took 216 s instead of 28 s)."""
    if "spark" not in request.fixturenames:
        yield
        return
    from airflow_provider_checkpoint.spark.session import DEFAULT_CONF

    spark = request.getfixturevalue("spark")
    keys = [k for k in DEFAULT_CONF if k.startswith("spark.sql.")]
    before = {k: spark.conf.get(k, None) for k in keys}
    yield
    changed = {k: (v, spark.conf.get(k, None)) for k, v in before.items() if spark.conf.get(k, None) != v}
    for key, (value, _) in changed.items():
        spark.conf.set(key, value)
    assert not changed, f"the test left the shared session's settings changed (was, now): {changed}"


@pytest.fixture
def small_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranges of 10 rows, at most 3 deltas, no bound by size: ranges split, deltas pile up and
    compact (some ranges at a time) within a few checkpoints."""
    from airflow_provider_checkpoint.state import incremental

    monkeypatch.setattr(incremental, "RANGE_ROWS", 10)
    monkeypatch.setattr(incremental, "MAX_DELTAS", 3)
    monkeypatch.setattr(incremental, "COMPACTION_RATIO", 1000.0)


_pg_schemas = itertools.count()


@pytest.fixture
def pg_schema(postgres_server: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh PostgreSQL schema for a sink's table, its bookkeeping and dead letters, behind connection ``pg_test``."""
    monkeypatch.setenv("AIRFLOW_CONN_PG_TEST", postgres_server.uri())
    schema = f"s{next(_pg_schemas)}_{uuid.uuid4().hex[:6]}"
    with postgres_server.connect() as db:
        db.execute(f"CREATE SCHEMA {schema}")
    return schema
