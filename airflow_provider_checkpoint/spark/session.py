"""The SparkSession a step runs in: embedded (``local``) or a Spark Connect server (``connect``).

An embedded session is quiet in the task log: no console progress bars, the driver's
log4j output (warnings and errors only, :file:`log4j2.properties` next to this module)
goes to stdout, and so do the JVM's own start-up lines. Airflow records a task's stderr
at ERROR level, so a healthy step shows nothing at ERROR. py4j's per-connection lines
("Closing down clientserver connection") are kept below WARNING out of the task log.

A step task holds its session through a :class:`SparkHandle` (:func:`step_session`): a step that may read
and merge on the driver alone starts it only when something first needs it, so such a step's task starts
no JVM at all.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOG4J2_PROPERTIES = Path(__file__).with_name("log4j2.properties")
CDS_ENV = "CHECKPOINT_SPARK_CDS"

log = logging.getLogger(__name__)

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


def connect_server_conf() -> dict[str, str]:
    """The configuration the provider gives a Spark Connect server its steps run on (``--conf`` each, to
    ``SparkConnectServer``): an embedded step's (:data:`DEFAULT_CONF`, the driver's Java options and class-data
    archive) with the full JIT, since a server outlives many steps (docs/execution-modes.md)."""
    return embedded_conf(input_bytes=FULL_JIT_INPUT_BYTES)


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
            log.info(
                "the step reads %d MiB: its JVM compiles hot code with C2 too (below %d MiB, C1 alone)",
                (input_bytes or 0) >> 20,
                FULL_JIT_INPUT_BYTES >> 20,
            )
        # the JVM's stderr (its start-up warnings) joins stdout, which the task log records as INFO: file
        # descriptor 1 itself (subprocess.STDOUT would ask sys.__stdout__, closed in a Celery worker's task)
        gateway = launch_gateway(spark_conf, popen_kwargs={"stderr": 1})
        SparkContext(conf=spark_conf, gateway=gateway)
    return SparkSession.builder.config(conf=spark_conf).getOrCreate()


SPARK_DEFAULTS = {
    "spark.sql.timestampType": "TIMESTAMP_LTZ",
    "spark.sql.execution.arrow.useLargeVarTypes": "false",
}
"""Spark's defaults of the settings a step reads before it needs a session (a test compares them with a
session's)."""
STEP_SPARK_ENV = "CHECKPOINT_STEP_SPARK"
"""``eager``: a step task starts its session before the step runs, whether the step needs it or not."""


def _caller() -> str:
    """``module:function`` of the nearest frame outside this module and the step context."""
    frame = sys._getframe(1)
    skipped = (__file__, str(Path(__file__).parents[1] / "dataflow" / "context.py"))
    while frame.f_back is not None and frame.f_code.co_filename in skipped:
        frame = frame.f_back
    module = frame.f_globals.get("__name__", "?").removeprefix("airflow_provider_checkpoint.")
    return f"{module}:{frame.f_code.co_name}"


class SparkHandle:
    """A step's SparkSession, started on first use: a step whose every input is read and merged on the
    driver (:meth:`~airflow_provider_checkpoint.dataflow.graph.Source.read_in_driver`) runs without one, so
    its task starts no JVM.

    :meth:`get` starts the session the first time (one log line: what needed it, the start's seconds) and
    gives the same session after; :meth:`conf` answers the settings the driver paths read from ``known``
    (the configuration the session will start with, :func:`embedded_conf`, and :data:`SPARK_DEFAULTS`)
    without starting it; any other setting, or all with ``known`` ``None``, from the session.
    """

    def __init__(self, start: Callable[[], SparkSession], known: Mapping[str, str] | None = None) -> None:
        self._start = start
        self._known = dict(known) if known is not None else None
        self._session: SparkSession | None = None
        self.doing = "the step"
        """What the step is doing (the runner names the node), for the log line of the start."""

    @classmethod
    def of(cls, spark: SparkSession) -> SparkHandle:
        """A handle of a session already started."""
        handle = cls(lambda: spark)
        handle._session = spark
        return handle

    def again(self) -> SparkHandle:
        """A handle of the same session and configuration, not started (its start gives this one's session if
        that is started: :func:`get_spark` reuses the active session)."""
        return SparkHandle(self._start, self._known)

    @property
    def started(self) -> bool:
        return self._session is not None

    def get(self) -> SparkSession:
        """The session, started now if it was not (logged once, with the caller that needed it)."""
        if self._session is None:
            began = time.monotonic()
            self._session = self._start()
            log.info(
                "Spark session started for %s (needed by %s) in %.1fs", self.doing, _caller(), time.monotonic() - began
            )
        return self._session

    def known(self, key: str) -> str | None:
        """The value ``key`` will have in the session, from its configuration alone (``None``: not known)."""
        return None if self._known is None else self._known.get(key, SPARK_DEFAULTS.get(key))

    def conf(self, key: str) -> str:
        """The session's value of ``key``: from the known configuration while the session is not started,
        else (or if not known) from the session, started if need be."""
        if self._session is None:
            value = self.known(key)
            if value is not None:
                return value
        got = self.get().conf.get(key)
        if got is None:
            raise KeyError(f"Spark setting {key} has no value")
        return got


def _conf_files() -> bool:
    """Whether a ``spark-defaults.conf`` or ``PYSPARK_SUBMIT_ARGS`` may set what :func:`embedded_conf` does not
    show."""
    from pyspark.find_spark_home import _find_spark_home

    directories = [os.environ.get("SPARK_CONF_DIR"), f"{_find_spark_home()}/conf"]
    files = [Path(d) / "spark-defaults.conf" for d in directories if d]
    return "PYSPARK_SUBMIT_ARGS" in os.environ or any(f.is_file() for f in files)


def step_session(
    conf: dict[str, str] | None, remote: str | None, input_bytes: int | None, may_skip: bool
) -> SparkHandle:
    """The session of a step task (:func:`get_spark`'s arguments): started on first use when the step
    ``may_skip`` it (its inputs may all be read and merged on the driver) in ``local`` mode, unless
    ``CHECKPOINT_STEP_SPARK=eager``; else started now, as is one active in the process already (its
    settings may be other than ``conf``'s). A Spark Connect session (``remote``) is started now: its
    settings are the server's."""

    def start() -> SparkSession:
        return get_spark(conf=conf, remote=remote, input_bytes=input_bytes)

    from pyspark import SparkContext

    eager = os.environ.get(STEP_SPARK_ENV, "").lower() == "eager"
    if remote or not may_skip or eager or SparkContext._active_spark_context is not None:  # the last: no start
        return SparkHandle.of(start())
    return SparkHandle(start, None if _conf_files() else embedded_conf(conf, input_bytes))
