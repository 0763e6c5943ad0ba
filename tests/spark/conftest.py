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


@pytest.fixture
def small_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranges of 10 rows, at most 3 deltas, no bound by size: ranges split, deltas pile up and
    compact (some ranges at a time) within a few checkpoints."""
    from airflow_provider_checkpoint.state import incremental

    monkeypatch.setattr(incremental, "RANGE_ROWS", 10)
    monkeypatch.setattr(incremental, "MAX_DELTAS", 3)
    monkeypatch.setattr(incremental, "COMPACTION_RATIO", 1000.0)
