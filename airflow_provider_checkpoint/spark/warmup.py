"""Spark's Python workers started in the background while a step's driver prepares its first job.

A step whose data is read and written by the Python file engine (an object store without a
Hadoop filesystem) needs Python workers for its first Spark job; a fresh session starts them on
that job (the daemon's imports, a fork per core), seconds on a busy machine. Started when the step
begins, they come up while the driver reads its barrier, claims and state.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
_started: weakref.WeakSet[SparkContext] = weakref.WeakSet()
"""The sessions whose workers were started (once per session)."""


def start_python_workers(spark: SparkSession) -> threading.Thread | None:
    """Run one empty Python task per core of an embedded session in a background thread (nothing for a
    Spark Connect session, nor once this session's workers ran); the thread, to join if needed."""
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        return None
    context = spark.sparkContext
    if context in _started:
        return None
    _started.add(context)
    tasks = max(1, context.defaultParallelism)

    def run() -> None:
        try:
            spark.range(0, tasks, 1, tasks).mapInArrow(_nothing, "id long").collect()
        except Exception as e:  # the step's own jobs start them anyway, and report what fails
            log.debug("starting Python workers early failed: %s", e)

    thread = threading.Thread(target=run, name="python-workers", daemon=True)
    thread.start()
    return thread


def _nothing(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for _ in batches:
        pass
    yield from ()
