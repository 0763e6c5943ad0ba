"""Where a step's Spark job runs, chosen by the Spark provider's connections.

* ``local``: no connection — an embedded ``local[*]`` session inside the step task.
* ``connect``: a ``spark_connect`` connection — a session from ``SparkConnectHook``'s URL.
* ``submit``: a ``spark`` connection (``spark://…``, ``yarn``, ``k8s://…``, ``local[n]``) —
  ``SparkSubmitHook`` runs the package's driver in client deploy mode
  (:mod:`airflow_provider_checkpoint.spark.submitted`); the driver writes the ack into the
  step's attempt directory and the task reads it back and verifies it (:mod:`.acks`).

The connection id comes from the pipeline (``spark_conn_id=``), else ``[checkpoint]
spark_conn_id``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from airflow_provider_checkpoint.exceptions import PipelineDefinitionError


class ExecutionMode(enum.StrEnum):
    LOCAL = "local"
    CONNECT = "connect"
    SUBMIT = "submit"


@dataclass(frozen=True)
class Execution:
    mode: ExecutionMode
    conn_id: str | None = None
    remote: str | None = None

    def describe(self) -> str:
        if self.mode is ExecutionMode.LOCAL:
            return "an embedded local[*] session"
        how = "spark-submit" if self.mode is ExecutionMode.SUBMIT else "Spark Connect"
        return f"{how} through connection {self.conn_id!r}"


def resolve_execution(spark_conn_id: str | None) -> Execution:
    """The execution of a job's steps from its options and the ``[checkpoint]`` section."""
    from airflow_provider_checkpoint.storage.config import config_value

    conn_id = spark_conn_id or config_value("spark_conn_id") or None
    if conn_id:
        from airflow.sdk import BaseHook

        conn_type = BaseHook.get_connection(conn_id).conn_type
        if conn_type == "spark":
            return Execution(ExecutionMode.SUBMIT, conn_id)
        if conn_type == "spark_connect":
            from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

            return Execution(ExecutionMode.CONNECT, conn_id, SparkConnectHook(conn_id).get_connection_url())
        raise PipelineDefinitionError(
            f"connection {conn_id!r} has type {conn_type!r}: steps run through a 'spark' connection "
            "(spark-submit) or a 'spark_connect' connection (Spark Connect)"
        )
    return Execution(ExecutionMode.LOCAL)
