"""Delta Lake's own Spark connector (delta-spark, the reference implementation of the Delta protocol)
for the interoperability tests: a Spark Connect server of its own with the delta-spark jars that
``scripts/install_delta_spark.sh`` fetches, and a remote session on it.

The provider's own (classic, embedded) session never loads these jars: the tests drive our sink and
source in it and delta-spark in the server, one server per test module.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.live.spark_connect import spark_connect_server

JARS = Path(sys.prefix) / "share" / "airflow-provider-checkpoint" / "delta-spark"
CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # VACUUM ... RETAIN 0 HOURS on tables written a second ago
    "spark.databricks.delta.retentionDurationCheck.enabled": "false",
}


def jars() -> list[Path]:
    """The delta-spark jars, or a skip (a failure in CI) saying how to fetch them."""
    found = sorted(JARS.glob("*.jar")) if any(JARS.glob(".complete-*")) else []
    if not found:
        message = f"no delta-spark jars in {JARS}: run scripts/install_delta_spark.sh"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


def delta_spark_session(log: Path) -> Iterator[Any]:
    """A remote session on a Spark Connect server running delta-spark (for a module-scoped fixture)."""
    from pyspark.sql.connect.session import SparkSession as RemoteSession

    conf = {**CONF, "spark.jars": ",".join(str(j) for j in jars())}
    with spark_connect_server(log, conf=conf) as url:
        session = RemoteSession.builder.remote(url).create()  # create(): the classic session stays the active one
        try:
            yield session
        finally:
            session.stop()


def delta_spark_rows(session: Any, path: Path, columns: Sequence[str]) -> list[tuple[Any, ...]]:
    """The ``columns`` of every live row of the Delta table at ``path`` read by delta-spark, sorted by repr."""
    if not (path / "_delta_log").is_dir():
        return []
    found = session.read.format("delta").load(str(path)).select(*columns).collect()
    return sorted((tuple(r) for r in found), key=repr)


def sql(session: Any, statement: str) -> list[dict[str, Any]]:
    """The rows of one delta-spark SQL statement, as dicts."""
    return [r.asDict() for r in session.sql(statement).collect()]
