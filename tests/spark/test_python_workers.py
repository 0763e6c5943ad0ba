"""The embedded session's Python workers: forked from the provider's daemon with the file engine's
libraries loaded."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest

from airflow_provider_checkpoint.spark import daemon

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


def _forked_from(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    import sys

    for _ in batches:
        pass
    main = sys.modules["__main__"].__spec__
    loaded = all(name in sys.modules for name in daemon.PRELOADED)
    yield pa.RecordBatch.from_pydict({"daemon": [main.name if main else ""], "loaded": [loaded]})


def test_workers_are_forked_from_the_provider_daemon_with_its_modules(spark: SparkSession) -> None:
    rows = spark.range(0, 2, 1, 2).mapInArrow(_forked_from, "daemon string, loaded boolean").collect()
    assert [(r["daemon"], r["loaded"]) for r in rows] == [(daemon.__name__, True)] * 2
