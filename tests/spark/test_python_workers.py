"""The embedded session's Python workers: forked from the provider's daemon with the file engine's
libraries loaded, and started in the background at a step's start when its data needs them."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest

from airflow_provider_checkpoint.spark import daemon, warmup

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


def test_workers_are_started_once_per_session_in_the_background(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(warmup, "_started", weakref.WeakSet())
    with caplog.at_level(logging.DEBUG, logger=warmup.__name__):
        thread = warmup.start_python_workers(spark)
        assert thread is not None
        thread.join(timeout=120)
    assert not thread.is_alive() and not caplog.records, caplog.text
    assert warmup.start_python_workers(spark) is None
