"""The Python worker daemon of the provider's Spark sessions: pyspark's own (``pyspark.daemon``), with the
libraries every step's Python workers use imported once, before it forks them.

Spark starts one daemon per executor and forks a Python worker from it for each concurrent task;
every worker would otherwise import pyarrow, pandas, fsspec (and s3fs for ``s3://`` data) and this
provider's file engine on its first task, a second or more each. Forked from a daemon that has
imported them, a worker starts with them loaded. Set as ``spark.python.daemon.module`` by
:func:`~airflow_provider_checkpoint.spark.session.get_spark` (docs/operations.md: set it on a cluster).
"""

from __future__ import annotations

import importlib

PRELOADED = (
    "pyarrow",
    "pyarrow.compute",
    "pyarrow.parquet",
    "pandas",
    "fsspec",
    "s3fs",
    "pyspark.worker",
    "airflow_provider_checkpoint.fileio.scans",
    "airflow_provider_checkpoint.fileio.writes",
)
"""Imported by the daemon before it forks a worker; one that is not installed is skipped."""


def preload() -> None:
    for name in PRELOADED:
        try:
            importlib.import_module(name)
        except ImportError:  # e.g. s3fs where no data is on S3: the worker imports what it needs itself
            continue


if __name__ == "__main__":
    preload()
    from pyspark.daemon import manager

    manager()
