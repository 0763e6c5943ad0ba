"""The sensors' triggers against real storage: serialization round trip and ``run()``.

The job's storage is written by the real coordinator (see test_coordinator.py); the
triggers run in an asyncio loop as the triggerer runs them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from collections.abc import AsyncIterator
from typing import Any

from airflow.sdk.module_loading import import_string
from airflow.triggers.base import TriggerEvent

from airflow_provider_checkpoint.core.model import RestoreRequest
from airflow_provider_checkpoint.hooks.checkpoint import CheckpointStorageHook
from airflow_provider_checkpoint.storage.job_records import JobRecordStore
from airflow_provider_checkpoint.triggers.checkpoint import (
    CheckpointCompletedTrigger,
    CheckpointInputTrigger,
    source_spec,
)
from tests.unit.helpers import JOB, T0, Env, run_checkpoint

DEADLINE = 10.0


def run_isolated(coroutine: Any) -> Any:
    """``asyncio.run`` in a thread of its own: an event loop that another test left running in
    this thread (Playwright's sync API in the live UI tests) cannot interfere."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def hook(env: Env) -> CheckpointStorageHook:
    return CheckpointStorageHook(JOB, str(env.root / "ckpt"))


def input_trigger(env: Env) -> CheckpointInputTrigger:
    return CheckpointInputTrigger(
        job_id=JOB,
        storage_root=str(env.root / "ckpt"),
        sources=[source_spec(s) for s in env.coordinator.graph.sources],
        poke_interval=0.01,
    )


def completed_trigger(env: Env, after: int, savepoint: bool = False) -> CheckpointCompletedTrigger:
    return CheckpointCompletedTrigger(
        job_id=JOB,
        storage_root=str(env.root / "ckpt"),
        after_checkpoint_id=after,
        savepoint=savepoint,
        poke_interval=0.01,
    )


async def first_event(trigger: Any, act: Any = None) -> TriggerEvent:
    """Run ``trigger``; check it has not fired after a few polls, then ``act`` and await its event."""
    events: AsyncIterator[TriggerEvent] = trigger.run()
    pending = asyncio.ensure_future(events.__anext__())
    if act is not None:
        done, _ = await asyncio.wait({pending}, timeout=0.3)  # ~30 polls
        assert not done, f"fired before the condition held: {pending.result() if done else None}"
        await asyncio.to_thread(act)
    return await asyncio.wait_for(pending, DEADLINE)


def roundtrip(trigger: Any) -> Any:
    classpath, kwargs = trigger.serialize()
    json.dumps(kwargs)  # stored in the metadata DB as JSON
    rebuilt = import_string(classpath)(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)
    return rebuilt


def test_triggers_serialize_round_trip(env: Env) -> None:
    rebuilt = roundtrip(input_trigger(env))
    assert rebuilt.sources[0]["args"]["path"] == str(env.landing)
    rebuilt = roundtrip(completed_trigger(env, 7, savepoint=True))
    assert (rebuilt.after_checkpoint_id, rebuilt.savepoint) == (7, True)


def test_input_trigger_fires_on_new_input_only(env: Env) -> None:
    sources = env.coordinator.graph.sources
    assert hook(env).new_input(sources) == ["events"], "a.json before any checkpoint is new input"
    run_checkpoint(env, "run-1", T0)
    assert hook(env).new_input(sources) == []

    # rebuilt from its serialized form, as the triggerer does
    event = run_isolated(
        first_event(roundtrip(input_trigger(env)), lambda: (env.landing / "b.json").write_text("{}\n"))
    )
    assert event.payload == {"status": "success", "sources": ["events"]}


def test_input_trigger_counts_a_restore_request_as_input(env: Env) -> None:
    run_checkpoint(env, "run-1", T0)
    JobRecordStore(env.storage).write_restore_request(RestoreRequest("1" * 32, env.storage.url("chk-1"), 1, False, T0))
    assert hook(env).new_input(env.coordinator.graph.sources) == ["events"]


def test_completed_trigger_fires_when_a_newer_checkpoint_is_committed(env: Env) -> None:
    run_checkpoint(env, "run-1", T0)
    assert hook(env).committed_after(0) == {"checkpoint_id": 1, "end_time": env.stats(1)["end_time"]}

    def second_checkpoint() -> None:
        (env.landing / "b.json").write_text('{"k": 2}\n')
        run_checkpoint(env, "run-2", T0 + 10)

    event = run_isolated(first_event(roundtrip(completed_trigger(env, 1)), second_checkpoint))
    assert event.payload["status"] == "success" and event.payload["checkpoint_id"] == 2


def test_completed_trigger_ignores_metadata_whose_sinks_are_not_committed(env: Env) -> None:
    run_checkpoint(env, "run-1", T0)
    (env.job_dir / "_stats" / "1.json").unlink()  # as after a crash right after _metadata
    assert hook(env).committed_after(0) is None


def test_completed_trigger_for_savepoints(env: Env) -> None:
    run_checkpoint(env, "run-1", T0)
    assert hook(env).committed_after(0, savepoint=True) is None
    job = JobRecordStore(env.storage).load()
    job.savepoints.append({"checkpoint_id": 1, "path": "file:///sp/savepoint-1", "time": T0})
    JobRecordStore(env.storage).save(job)
    event = run_isolated(first_event(completed_trigger(env, 0, savepoint=True)))
    assert event.payload == {"status": "success", "checkpoint_id": 1, "savepoint": "file:///sp/savepoint-1"}


def test_trigger_reports_a_refused_document_as_refused_event(env: Env) -> None:
    run_checkpoint(env, "run-1", T0)
    (env.chk(1) / "_metadata").write_text("not a checkpoint")
    event = run_isolated(first_event(input_trigger(env)))
    assert event.payload["status"] == "refused" and f"job {JOB}" in event.payload["message"]
    assert "chk-1/_metadata" in event.payload["message"] and "not valid JSON" in event.payload["message"]


def test_every_watched_source_describes_itself_and_round_trips(tmp_path: Any) -> None:
    from datetime import timedelta

    from airflow_provider_checkpoint.dataflow import DeltaSource, FileSource
    from airflow_provider_checkpoint.triggers.checkpoint import source_from_spec

    files = FileSource(
        "events", str(tmp_path), "json", "id LONG", partition_pattern="%Y/%m/%d", partition_lateness=timedelta(hours=2)
    )
    delta = DeltaSource("orders", str(tmp_path), storage_options={"AWS_REGION": "eu-west-1", "anon": False})
    for source in (files, delta):
        spec = json.loads(json.dumps(source_spec(source)))  # stored in the metadata DB as JSON
        rebuilt = source_from_spec(spec)
        assert type(rebuilt) is type(source) and source_spec(rebuilt) == spec
    rebuilt_files = source_from_spec(source_spec(files))
    assert isinstance(rebuilt_files, FileSource)
    assert (rebuilt_files.partition_pattern, rebuilt_files.partition_lateness) == ("%Y/%m/%d", timedelta(hours=2))
    rebuilt_delta = source_from_spec(source_spec(delta))
    assert isinstance(rebuilt_delta, DeltaSource) and rebuilt_delta.delta_only == {"aws_region": "eu-west-1"}


def test_a_source_spec_names_only_this_packages_sources() -> None:
    import pytest

    from airflow_provider_checkpoint.dataflow import Source
    from airflow_provider_checkpoint.exceptions import CheckpointError
    from airflow_provider_checkpoint.triggers.checkpoint import source_from_spec

    for bad in (
        {"class": "os.system", "args": {}},
        {"class": "airflow_provider_checkpoint.connectors.files.landing.Listing", "args": {}},
        {"class": "airflow_provider_checkpoint.connectors.delta.sink.DeltaTableSink", "args": {}},
        {"class": 3, "args": {}},
        {"args": {}},
    ):
        with pytest.raises(CheckpointError, match="names no source of this package"):
            source_from_spec(bad)
    with pytest.raises(TypeError, match="Plain cannot be watched by a deferred sensor"):
        source_spec(type("Plain", (Source,), {})("plain"))


def test_a_kafka_source_round_trips_for_the_deferred_sensor() -> None:
    from airflow_provider_checkpoint.dataflow import KafkaSource
    from airflow_provider_checkpoint.triggers.checkpoint import source_from_spec

    source = KafkaSource(
        "clicks", pattern=r"clicks-.*", kafka_config_id="k", schema="user STRING", starting_offsets=1_700_000_000_000,
        max_records_per_checkpoint=1000, fail_on_data_loss=False, metadata_columns=["offset", "headers"],
    )  # fmt: skip
    spec = json.loads(json.dumps(source_spec(source)))
    rebuilt = source_from_spec(spec)
    assert isinstance(rebuilt, KafkaSource) and source_spec(rebuilt) == spec
    assert (rebuilt.pattern, rebuilt.starting_offsets, rebuilt.metadata_columns) == (
        "clicks-.*",
        1_700_000_000_000,
        ("offset", "headers"),
    )
