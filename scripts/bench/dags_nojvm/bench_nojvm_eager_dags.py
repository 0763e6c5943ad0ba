"""Airflow DAGs: the tasks-nojvm mode's jobs whose step tasks start their JVM before the step (:mod:`bench.nojvm_jobs`).

A task process parses only its own DAG's file, so the setting below reaches these DAGs' tasks alone.
"""

from __future__ import annotations

import os

os.environ["CHECKPOINT_STEP_SPARK"] = "eager"

from bench.nojvm_jobs import declare  # noqa: E402

globals().update(declare("eager"))
