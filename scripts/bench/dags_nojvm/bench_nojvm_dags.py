"""Airflow DAGs: the tasks-nojvm mode's jobs as they run by default: a step starts Spark only if it needs it
(:mod:`bench.nojvm_jobs`)."""

from __future__ import annotations

from bench.nojvm_jobs import declare

globals().update(declare("lazy"))
