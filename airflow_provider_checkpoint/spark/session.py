"""The SparkSession a step runs in: embedded (``local``) or a Spark Connect server (``connect``).

An embedded session is quiet in the task log: no console progress bars, the driver's
log4j output (warnings and errors only, :file:`log4j2.properties` next to this module)
goes to stdout, and so do the JVM's own start-up lines. Airflow records a task's stderr
at ERROR level, so a healthy step shows nothing at ERROR. py4j's per-connection lines
("Closing down clientserver connection") are kept below WARNING out of the task log.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOG4J2_PROPERTIES = Path(__file__).with_name("log4j2.properties")
CDS_ENV = "CHECKPOINT_SPARK_CDS"

DEFAULT_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.sources.partitionOverwriteMode": "static",
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    # no .crc side files next to state and table files: checksums are ours (SHA-256 in handles)
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    # state files kept from older checkpoints are not re-hashed: every page's CRC is checked on read
    "spark.hadoop.parquet.page.verify-checksum.enabled": "true",
    # a step caches its input for one step only: building an uncompressed cache is faster
    "spark.sql.inMemoryColumnarStorage.compressed": "false",
    # adaptive execution coalesces a cached result's small shuffle partitions too: a sink
    # writes one file per task, not one per `spark.sql.shuffle.partitions`
    "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning": "true",
    # Python workers forked with pyarrow, pandas, fsspec/s3fs and the file engine already imported
    "spark.python.daemon.module": "airflow_provider_checkpoint.spark.daemon",
}

C1_ONLY = "-XX:TieredStopAtLevel=1"
DRIVER_JAVA_OPTIONS = (
    f"-Dlog4j2.configurationFile={LOG4J2_PROPERTIES.as_uri()}",
    # a step's JVM lives seconds to minutes: the C1 compiler alone starts it much faster
    C1_ONLY,
    "-Xshare:auto",
)
"""Prepended to ``spark.driver.extraJavaOptions``: options given in ``conf`` come later and win."""
FULL_JIT_INPUT_BYTES = 128 << 20
"""A step that reads at least this many bytes runs long enough for the C2 compiler to pay off: its JVM
starts without :data:`C1_ONLY` (docs/operations.md has the figures)."""


def archive_path() -> Path:
    """Where the archive of this environment lives: one per pyspark version, under ``sys.prefix``."""
    from pyspark import __version__

    return Path(sys.prefix) / "share" / "airflow-provider-checkpoint" / f"spark-{__version__}-driver.jsa"


def full_jit(input_bytes: int | None) -> bool:
    """Whether a step reading ``input_bytes`` (``None``: not known) starts its JVM with the full JIT."""
    return input_bytes is not None and input_bytes >= FULL_JIT_INPUT_BYTES


def driver_java_options(input_bytes: int | None = None) -> tuple[str, ...]:
    """:data:`DRIVER_JAVA_OPTIONS` (without :data:`C1_ONLY` for a step reading ``input_bytes`` that
    :func:`full_jit` accepts), plus the class-data sharing archive if it was created.

    ``CHECKPOINT_SPARK_CDS=off`` leaves the archive out.
    """
    options = tuple(o for o in DRIVER_JAVA_OPTIONS if o != C1_ONLY) if full_jit(input_bytes) else DRIVER_JAVA_OPTIONS
    archive = archive_path()
    if os.environ.get(CDS_ENV, "").lower() == "off" or not archive.is_file():
        return options
    return (*options, f"-XX:SharedArchiveFile={archive}")


def embedded_conf(conf: dict[str, str] | None = None, input_bytes: int | None = None) -> dict[str, str]:
    """The configuration of an embedded session for a step reading ``input_bytes``: the defaults, ``conf``
    over them."""
    merged = {**DEFAULT_CONF, **(conf or {})}
    options = driver_java_options(input_bytes)
    java_options = " ".join((*options, (conf or {}).get("spark.driver.extraJavaOptions", "")))
    merged["spark.driver.extraJavaOptions"] = java_options.strip()
    return merged


def get_spark(
    master: str = "local[*]",
    conf: dict[str, str] | None = None,
    remote: str | None = None,
    input_bytes: int | None = None,
) -> SparkSession:
    """The SparkSession a step runs in.

    ``remote`` (``sc://host:port``) connects to a Spark Connect server (``connect``
    execution mode: no JVM in the task). Otherwise an embedded ``local`` session bound to
    loopback, reusing the active one in this process; a JVM started for a step that reads
    ``input_bytes`` gets the JIT that suits it (:func:`full_jit`).
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # Python workers run in this environment
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway
    from pyspark.sql import SparkSession

    if remote:
        return SparkSession.builder.remote(remote).getOrCreate()
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    spark_conf = (
        SparkConf()
        .setMaster(master)
        .setAppName("airflow-checkpoint")
        .setAll(list(embedded_conf(conf, input_bytes).items()))
    )
    if SparkContext._active_spark_context is None:
        if full_jit(input_bytes):
            logging.getLogger(__name__).info(
                "the step reads %d MiB: its JVM compiles hot code with C2 too (below %d MiB, C1 alone)",
                (input_bytes or 0) >> 20,
                FULL_JIT_INPUT_BYTES >> 20,
            )
        # the JVM's stderr (its start-up warnings) joins stdout, which the task log records as INFO: file
        # descriptor 1 itself (subprocess.STDOUT would ask sys.__stdout__, closed in a Celery worker's task)
        gateway = launch_gateway(spark_conf, popen_kwargs={"stderr": 1})
        SparkContext(conf=spark_conf, gateway=gateway)
    return SparkSession.builder.config(conf=spark_conf).getOrCreate()
