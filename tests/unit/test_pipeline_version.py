"""The version of a pipeline's definition, and the trigger's pipeline check once per version (no Spark).

The check itself (Spark over empty input) is tested in ``tests/spark/test_pipeline_check.py``; here a
recorded stand-in returns the problems, to pin what the coordinator does with them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from airflow_provider_checkpoint.dataflow import FileSource, ParquetTableSink, PipelineGraph, Transform
from airflow_provider_checkpoint.dataflow.graph import collecting
from airflow_provider_checkpoint.dataflow.version import VersionCheck, pipeline_version
from airflow_provider_checkpoint.exceptions import PipelineCheckError
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.storage.job_records import JobRecordStore
from tests.unit.helpers import T0, Env, make_ack


def _graph(
    schema: str = "user STRING, ts LONG", fn: Callable[..., object] = lambda df: df.select("user")
) -> PipelineGraph:
    with collecting() as nodes:
        events = FileSource("events", "/landing", "json", schema)
        ParquetTableSink("out", Transform("pick", events, fn), "/marts/out")
    return PipelineGraph(nodes)


def test_the_same_definition_has_the_same_version_and_any_change_a_new_one(tmp_path: Path) -> None:
    base = pipeline_version(_graph())
    assert pipeline_version(_graph()) == base  # declared again, as every task parses the DAG file
    assert pipeline_version(_graph(schema="user STRING, ts STRING")) != base
    assert pipeline_version(_graph(fn=lambda df: df.select("usr"))) != base  # the transform's code
    column = "user"
    by_closure = pipeline_version(_graph(fn=lambda df: df.select(column)))
    column = "usr"
    assert pipeline_version(_graph(fn=lambda df: df.select(column))) != by_closure  # the data the code reads
    bound = _graph()
    for sink in bound.sinks:
        sink.bind_job("some-job")  # what a running sink learns is not part of the definition
        sink.bind_storage(JobStorage.for_job(str(tmp_path), "some-job"))  # as the coordinator binds it
    assert pipeline_version(bound) == base and len(base) == 16


class _Recorded:
    """Problems to report per call, and how many times the check ran."""

    def __init__(self, *answers: list[str]) -> None:
        self.answers, self.calls = list(answers), 0

    def __call__(self) -> list[str]:
        self.calls += 1
        return self.answers.pop(0)


def test_a_failing_version_is_refused_before_an_id_and_a_passing_one_is_checked_once(env: Env) -> None:
    bad = _Recorded(["pick: [UNRESOLVED_COLUMN] usr (fix: use user)", "out: retyped column(s) ts (fix: cast)"])
    with pytest.raises(PipelineCheckError, match=r"2 problem\(s\).*1\) pick: \[UNRESOLVED_COLUMN\] usr.*2\) out: "):
        env.coordinator.trigger("run-1", now=T0, check=VersionCheck("v1", bad))
    assert bad.calls == 1 and not list(env.job_dir.glob("chk-*"))  # nothing planned, nothing staged
    records = JobRecordStore(env.storage)
    assert records.lease_holder() is None and records.load().last_checkpoint_id == 0
    assert records.load().failures.count == 0 and records.load().checked_version == ""

    good = _Recorded([], [])
    plan = env.coordinator.trigger("run-2", now=T0 + 10, check=VersionCheck("v2", good))
    assert plan.checkpoint_id == 1 and records.load().checked_version == "v2" and good.calls == 1
    env.coordinator.finalize(plan, [make_ack(env, plan)], now=T0 + 11)
    plan = env.coordinator.trigger("run-3", now=T0 + 20, check=VersionCheck("v2", good))
    assert plan.checkpoint_id == 2 and good.calls == 1  # the version passed: not checked again
    env.coordinator.finalize(plan, [make_ack(env, plan)], now=T0 + 21)
    assert env.job_record()["checked_version"] == "v2"
