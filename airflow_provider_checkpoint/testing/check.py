"""``check_pipeline``: the pipeline check in a test, as the trigger runs it before a version's first checkpoint.

::

    from airflow_provider_checkpoint.testing.check import check_pipeline

    def test_pipeline_checks_clean():
        assert check_pipeline(pipeline) == []   # a CheckpointedPipeline, its DAG, or its CheckpointJob

Each problem names the node's uid, what Spark or the sink's target refused, and a fix
(:class:`~airflow_provider_checkpoint.spark.dry_run.Problem`). No record is read, nothing is written.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_checkpoint.jobs.check import check_job, job_of
from airflow_provider_checkpoint.spark.dry_run import Problem


def check_pipeline(pipeline: Any) -> list[Problem]:
    """The problems of ``pipeline`` (a ``CheckpointedPipeline``, its DAG, or a ``CheckpointJob``); empty when
    it passes. Runs in the Spark session its steps would use (an embedded local one by default)."""
    return check_job(job_of(pipeline))
