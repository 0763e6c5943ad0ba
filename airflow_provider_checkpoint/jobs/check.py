"""The pipeline check of a job (:mod:`airflow_provider_checkpoint.spark.dry_run`) in the Spark its steps use.

The trigger runs it once per version of the pipeline's definition; ``airflow checkpoints check`` and
:func:`airflow_provider_checkpoint.testing.check.check_pipeline` run it on demand.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

if TYPE_CHECKING:
    from airflow_provider_checkpoint.jobs.definition import CheckpointJob
    from airflow_provider_checkpoint.spark.dry_run import Problem


def job_of(target: Any) -> CheckpointJob:
    """The checkpointed job of ``target``: a ``CheckpointedPipeline``, its DAG, or the job itself."""
    from airflow_provider_checkpoint.jobs.definition import CheckpointJob

    if isinstance(target, CheckpointJob):
        return target
    job = getattr(target, "job", None)
    if isinstance(job, CheckpointJob):
        return job
    jobs = {
        t.job.job_id: t.job for t in getattr(target, "tasks", ()) if isinstance(getattr(t, "job", None), CheckpointJob)
    }
    if len(jobs) != 1:
        name = getattr(target, "dag_id", None) or type(target).__name__
        found = f"the jobs {sorted(jobs)}" if jobs else "no checkpointed job"
        raise PipelineDefinitionError(f"{name} runs {found}; the check takes one checkpointed pipeline")
    return next(iter(jobs.values()))


def check_job(job: CheckpointJob) -> list[Problem]:
    """The problems of ``job``'s pipeline (empty when it passes), checked in a session like its steps': a Spark
    Connect server's through a ``spark_connect`` connection, else an embedded local one (also for
    ``spark-submit`` steps: the check reads no data)."""
    from airflow_provider_checkpoint.spark.dry_run import check_graph
    from airflow_provider_checkpoint.spark.execution import resolve_execution
    from airflow_provider_checkpoint.spark.session import get_spark

    execution = resolve_execution(job.spark_conn_id)
    spark = get_spark(conf=job.spark_conf, remote=execution.remote)
    return check_graph(spark, job.graph, job.job_id)
