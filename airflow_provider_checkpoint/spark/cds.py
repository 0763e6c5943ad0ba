"""A class-data sharing (CDS) archive for the embedded Spark driver: faster JVM start.

``python -m airflow_provider_checkpoint.spark.cds`` starts an embedded session in a
child process, runs three small checkpoints of a pipeline (JSON source, two keyed
aggregates, an upsert and an append sink: full versions, a delta, the sinks' merges)
so that the classes a step loads are loaded, and lets the JVM dump every loaded class at exit
(``-XX:ArchiveClassesAtExit``). The archive lands under the Python environment
(:func:`~.session.archive_path`), written under a temporary name and renamed when complete;
:func:`~.session.get_spark` uses it when it exists. An
archive that does not fit the JVM or class path is ignored by the JVM (``-Xshare:auto``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from airflow_provider_checkpoint.spark.session import CDS_ENV, archive_path

_WORKLOAD = """
import sys, tempfile
from pathlib import Path
from pyspark import SparkContext
from airflow_provider_checkpoint.dataflow import FileSource, KeyedAggregate, ParquetTableSink
from airflow_provider_checkpoint.spark.session import get_spark
from airflow_provider_checkpoint.testing.clickstream import land_events
from airflow_provider_checkpoint.testing.inprocess import make_job
spark = get_spark(master="local[1]", conf={"spark.driver.extraJavaOptions": "-XX:ArchiveClassesAtExit=" + sys.argv[1]})
d = Path(tempfile.mkdtemp())
def declare(base):
    events = FileSource("events", f"{base}/landing", "json", "user STRING, page STRING, ts LONG")
    users = KeyedAggregate("users", events, keys=["user"], aggs={"n": "count", "last": "max(ts)"})
    ParquetTableSink("users_table", users, f"{base}/users", mode="upsert", keys=["user"])
    pages = KeyedAggregate("pages", events, keys=["page"], aggs={"n": "count"})
    ParquetTableSink("pages_table", pages, f"{base}/pages", mode="append")
job = make_job(spark, d, declare, inline_state_threshold=0)
for i in range(1, 4):  # a full version, a delta, a full version: the classes a step loads
    land_events(d / "landing", f"events-{i}.json", 2000, seed=i, users=300)
    job.checkpoint()
spark.read.parquet(str(d / "users")).toPandas()
proc = SparkContext._gateway.proc
spark.stop()
proc.stdin.close()
sys.exit(proc.wait())  # the JVM writes the archive as it exits
"""


def create_archive() -> Path:
    """Create (or replace) the archive; raise if the JVM did not write it."""
    target = archive_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=".", suffix=".jsa", dir=target.parent)
    os.close(fd)
    os.unlink(partial)  # the JVM creates it
    try:
        env = {**os.environ, CDS_ENV: "off"}  # dumped from the base archive, not on top of an old one
        subprocess.run([sys.executable, "-c", _WORKLOAD, partial], check=True, stdout=subprocess.DEVNULL, env=env)
        if not Path(partial).is_file():
            raise RuntimeError(f"the JVM wrote no class-data sharing archive at {partial}")
        os.replace(partial, target)
    finally:
        Path(partial).unlink(missing_ok=True)
    return target


if __name__ == "__main__":
    print(f"class-data sharing archive written: {create_archive()}")
