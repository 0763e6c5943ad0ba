"""The embedded session's Python workers: forked from the provider's daemon with the file engine's
libraries loaded, and started in the background at a step's start when its data needs them."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest

from airflow_provider_checkpoint.spark import warmup

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


def _loaded(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    import sys

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"s3fs": [int("s3fs" in sys.modules)]})


def test_workers_start_with_the_file_engine_loaded(spark: SparkSession) -> None:
    """A task finds s3fs imported although nothing in pyspark or the task imported it: the daemon did."""
    rows = spark.range(0, 2, 1, 2).mapInArrow(_loaded, "s3fs long").collect()
    assert [r["s3fs"] for r in rows] == [1, 1]


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
