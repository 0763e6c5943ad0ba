"""A Spark Connect server on loopback for tests of the ``connect`` execution mode."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pyspark

from tests.live.airflow_live import free_port, poll, stop_process_group, tail


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def spark_connect_server(log: Path, timeout: float = 180.0, conf: dict[str, str] | None = None) -> Iterator[str]:
    """Start ``SparkConnectServer`` (local[2]) from the pyspark installation, with ``conf`` on top of the
    defaults; yield its ``sc://`` URL."""
    spark_home = Path(pyspark.__file__).parent
    port = free_port()
    env = {**os.environ, "SPARK_HOME": str(spark_home), "SPARK_LOCAL_IP": "127.0.0.1"}
    env.setdefault("JDK_JAVA_OPTIONS", "-XX:+UseSerialGC")
    command = [
        str(spark_home / "bin" / "spark-submit"),
        "--class",
        "org.apache.spark.sql.connect.service.SparkConnectServer",
        "--master",
        "local[2]",
        "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
        "--conf", f"spark.connect.grpc.binding.port={port}",
        "--conf", "spark.driver.host=127.0.0.1",
        "--conf", "spark.driver.bindAddress=127.0.0.1",
        "--conf", "spark.ui.enabled=false",
        "--conf", "spark.sql.shuffle.partitions=4",
        "--conf", "spark.sql.session.timeZone=UTC",
        "--conf", "spark.hadoop.fs.file.impl=org.apache.hadoop.fs.RawLocalFileSystem",
        "--conf", "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs=false",
    ]  # fmt: skip
    command += [arg for key, value in (conf or {}).items() for arg in ("--conf", f"{key}={value}")]
    command.append("spark-internal")
    with open(log, "ab") as out:
        proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"Spark Connect server exited with {proc.returncode}:\n{tail(log)}")
            return _listening(port)

        poll("the Spark Connect server to listen", ready, timeout)
        yield f"sc://127.0.0.1:{port}"
    finally:
        stop_process_group(proc)
