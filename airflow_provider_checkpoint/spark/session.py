"""The SparkSession a step runs in: embedded (``local``) or a Spark Connect server (``connect``)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.sources.partitionOverwriteMode": "static",
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    # no .crc side files next to state and table files: checksums are ours (SHA-256 in handles)
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
}


def get_spark(master: str = "local[*]", conf: dict[str, str] | None = None, remote: str | None = None) -> SparkSession:
    """The SparkSession a step runs in.

    ``remote`` (``sc://host:port``) connects to a Spark Connect server (``connect``
    execution mode: no JVM in the task). Otherwise an embedded ``local`` session bound to
    loopback, reusing the active one in this process.
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # Python workers run in this environment
    from pyspark.sql import SparkSession

    if remote:
        return SparkSession.builder.remote(remote).getOrCreate()
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    builder = SparkSession.builder.master(master).appName("airflow-checkpoint")
    for key, value in {**DEFAULT_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
