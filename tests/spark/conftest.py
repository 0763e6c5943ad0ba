from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local SparkSession for the whole test session (it takes seconds to start)."""
    from airflow_provider_checkpoint.spark.session import get_spark

    yield get_spark(master="local[2]")
