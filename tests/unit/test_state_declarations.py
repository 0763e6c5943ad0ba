"""State declarations: what a stateful operator's stored state means beyond its keys, recorded in each
snapshot and compared before a checkpoint continues or restores it (a changed window, aggregate or
TTL clock is refused with the fix)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_checkpoint.coordinator import CheckpointCoordinator
from airflow_provider_checkpoint.core import metadata
from airflow_provider_checkpoint.dataflow import FileSource, KeyedAggregate, WindowAggregate, session, sliding, tumbling
from airflow_provider_checkpoint.dataflow.graph import collecting
from airflow_provider_checkpoint.dataflow.planner import PipelineGraph
from airflow_provider_checkpoint.exceptions import MetadataError, RestoreError
from airflow_provider_checkpoint.restore.snapshot import Snapshot, check_compatible
from airflow_provider_checkpoint.storage import Location
from tests.unit.helpers import make_ack, make_env, sample

SCHEMA = "user STRING, ts TIMESTAMP, amount LONG"


def windows(**changes: Any) -> dict[str, str]:
    arguments: dict[str, Any] = {"window": tumbling("5 minutes"), "aggs": {"n": "count", "total": "sum(amount)"}}
    with collecting():
        events = FileSource("events", "/tmp/in", "json", SCHEMA, watermark=("ts", "10 minutes"))
        agg = WindowAggregate("w", events, ["user"], "ts", **{**arguments, **changes})
    return agg.state_declaration()


def totals(**changes: Any) -> dict[str, str]:
    with collecting():
        events = FileSource("events", "/tmp/in", "json", SCHEMA, watermark=("ts", "10 minutes"))
        agg = KeyedAggregate("t", events, ["user"], **{"aggs": {"n": "count"}, **changes})
    return agg.state_declaration()


def test_a_window_aggregate_declares_its_window_and_aggregates() -> None:
    assert windows() == {
        "aggregate n": "count(*)",
        "aggregate total": "sum(amount)",
        "ttl": "none",
        "window": "tumbling(size=300000 ms, slide=300000 ms)",
    }
    assert totals(ttl="1 day") == {"aggregate n": "count(*)", "ttl": "by processing time"}
    # what does not change the state's meaning is not declared: lateness, emit, the watermark's bound
    assert windows(allowed_lateness="1 minute", emit="update", watermark=("ts", "1 hour")) == windows()


def snapshot_of(declared: dict[str, str], uid: str = "counts") -> Snapshot:
    original = sample()
    state = dataclasses.replace(original.operators["counts"], declaration=tuple(sorted(declared.items())))
    checkpoint = dataclasses.replace(original, operators={uid: state})
    location = Location.from_url("file:///tmp/job/chk-7")
    return Snapshot(checkpoint, location, location)


@pytest.mark.parametrize(
    ("now", "named"),
    [
        (windows(window=tumbling("10 minutes")), "window 'tumbling(size=300000 ms, slide=300000 ms)' (the pipeline "),
        (windows(window=sliding("5 minutes", "1 minute")), "slide=60000 ms"),
        (windows(window=session("5 minutes")), "session(gap=300000 ms)"),
        (windows(aggs={"n": "count", "total": "max(amount)"}), "aggregate total 'sum(amount)'"),
        (windows(aggs={"n": "count"}), "aggregate total 'sum(amount)' (the pipeline declares none)"),
    ],
)
def test_a_changed_window_or_aggregate_is_refused_with_the_fix(now: dict[str, str], named: str) -> None:
    with pytest.raises(RestoreError) as refused:
        check_compatible(snapshot_of(windows(), "w"), "clicks", {"w": ("page", "user")}, False, {"w": now})
    message = str(refused.value)
    assert "operator 'w'" in message and named in message, message
    assert "give the operator a new uid" in message and "allow_non_restored_state" in message


TTL_EVENT = "by event time"


@pytest.mark.parametrize(
    ("before", "now"),
    [
        ({}, {"ttl": "by processing time"}),  # added: its state has no expiry times
        ({"ttl": TTL_EVENT}, {}),  # removed
        ({"ttl": TTL_EVENT}, {"ttl": "by processing time"}),  # another clock
    ],
)
def test_a_ttl_removed_added_or_on_another_clock_is_refused(before: dict[str, Any], now: dict[str, Any]) -> None:
    stored = totals(**{k: _ttl(v) for k, v in before.items()})
    declared = totals(**{k: _ttl(v) for k, v in now.items()})
    with pytest.raises(RestoreError, match=r"ttl '.*' \(the pipeline declares '.*'\)"):
        check_compatible(snapshot_of(stored), "clicks", {"counts": ("page", "user")}, False, {"counts": declared})


def _ttl(value: str) -> Any:
    from airflow_provider_checkpoint import TTL

    return TTL("1 day", time=value.split()[1])


def test_what_keeps_the_meaning_passes() -> None:
    keys = {"counts": ("page", "user")}
    same = totals(ttl="1 day")
    longer = totals(ttl="2 days")  # the stored expiries stay as they are; new writes take the new duration
    assert check_compatible(snapshot_of(same), "clicks", keys, False, {"counts": longer}) == []
    assert check_compatible(snapshot_of({}), "clicks", keys, False, {"counts": same}) == []  # written before
    assert check_compatible(snapshot_of(same), "clicks", keys, False, {}) == []  # declaration not known
    assert check_compatible(snapshot_of(same), "clicks", keys, False) == []


def test_the_declaration_goes_through_metadata() -> None:
    original = sample()
    counts = dataclasses.replace(original.operators["counts"], declaration=(("aggregate n", "count(*)"),))
    checkpoint = dataclasses.replace(original, operators={**original.operators, "counts": counts})
    assert metadata.decode(metadata.encode(checkpoint)) == checkpoint
    assert "declaration" not in json.loads(metadata.encode(original))["operators"]["counts"]


@pytest.mark.parametrize("declaration", [["count"], {"n": 1}, {"": "x"}, {"n": "x" * 1001}])
def test_a_bad_declaration_in_metadata_is_refused(declaration: object) -> None:
    doc = json.loads(metadata.encode(sample()))
    doc["operators"]["counts"]["declaration"] = declaration
    with pytest.raises(MetadataError, match="declaration"):
        metadata.decode(json.dumps(doc).encode(), source="chk-7/_metadata")


def test_the_trigger_refuses_to_continue_state_declared_otherwise(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    plan = env.coordinator.trigger("r1", now=1_700_000_000.0)
    ack = make_ack(env, plan)
    declared = env.coordinator.graph.state_declarations()["counts"]
    state = dataclasses.replace(ack.operators["counts"], declaration=tuple(sorted(declared.items())))
    env.coordinator.finalize(plan, [dataclasses.replace(ack, operators={"counts": state})], now=1_700_000_001.0)

    graph = env.coordinator.graph
    source, sink = graph.nodes["events"], graph.nodes["table"]
    with collecting():
        counts = KeyedAggregate("counts", source, keys=["k"], aggs={"n": "sum(k)"})
    sink.inputs = [counts]
    changed = CheckpointCoordinator(
        env.storage,
        PipelineGraph([source, counts, sink]),
        env.coordinator.settings,
        None,
        env.coordinator.allowed_roots,
    )
    with pytest.raises(RestoreError, match=r"operator 'counts' was written with aggregate n 'count\(\*\)'"):
        changed.trigger("r2", now=1_700_000_100.0)
    assert env.coordinator.trigger("r2", now=1_700_000_100.0).checkpoint_id == 2  # the old definition goes on


def processes(*states: Any) -> dict[str, str]:
    from airflow_provider_checkpoint.dataflow import KeyedProcess, KeyedProcessFunction

    class Alerts(KeyedProcessFunction):
        output_schema = "user STRING"

        def process(self, key: Any, rows: Any, ctx: Any) -> None:
            return None

    Alerts.states = list(states)
    with collecting():
        events = FileSource("events", "/tmp/in", "json", SCHEMA, watermark=("ts", "10 minutes"))
        process = KeyedProcess("p", events, ["user"], Alerts())
    return process.state_declaration()


def deduplicates(**how: Any) -> dict[str, str]:
    from airflow_provider_checkpoint.dataflow import Deduplicate

    with collecting():
        events = FileSource("events", "/tmp/in", "json", SCHEMA, watermark=("ts", "10 minutes"))
        dedup = Deduplicate("d", events, ["user"], **how)
    return dedup.state_declaration()


def test_a_keyed_process_declares_each_state_and_a_deduplicate_its_clock() -> None:
    from airflow_provider_checkpoint import TTL
    from airflow_provider_checkpoint.dataflow import ListState, MapState, ValueState

    declared = processes(ValueState("last", "INT"), MapState("pages", "string", "bigint", ttl=TTL("1 day")))
    assert declared == {
        "state last": "value of integer, ttl none",
        "state pages": "map of string -> integer, ttl by processing time",
    }
    # integer (and floating) types are stored alike: widening one is no change; a TTL's duration neither
    assert processes(ValueState("last", "bigint"), MapState("pages", "string", "int", ttl="2 days")) == declared
    assert processes(ListState("last", "int"))["state last"] == "list of integer, ttl none"
    assert deduplicates(within="1 day") == {"expiry": "by event time (within=)"}
    assert deduplicates(ttl="1 day") == {"expiry": "by processing time (ttl=)"}


@pytest.mark.parametrize(
    ("now", "named"),
    [
        ({"state last": "list of integer, ttl none"}, "state last 'value of integer, ttl none' (the pipeline "),
        ({"state last": "value of string, ttl none"}, "declares 'value of string, ttl none'"),
        ({"state last": "value of integer, ttl by event time"}, "ttl by event time"),
        ({}, "state last 'value of integer, ttl none' (the pipeline declares none)"),  # removed
    ],
)
def test_a_keyed_process_state_of_another_kind_type_or_clock_or_removed_is_refused(
    now: dict[str, str], named: str
) -> None:
    stored = {"state last": "value of integer, ttl none"}
    with pytest.raises(RestoreError) as refused:
        check_compatible(snapshot_of(stored, "p"), "clicks", {"p": ("page", "user")}, False, {"p": now})
    assert named in str(refused.value), refused.value
    added = {**stored, "state seen": "list of string, ttl none"}  # a state added starts empty: no change
    assert check_compatible(snapshot_of(stored, "p"), "clicks", {"p": ("page", "user")}, False, {"p": added}) == []


def test_a_deduplicate_switched_between_within_and_ttl_is_refused() -> None:
    with pytest.raises(RestoreError, match=r"expiry 'by event time \(within=\)' \(the pipeline declares 'by proc"):
        check_compatible(
            snapshot_of(deduplicates(within="1 day"), "d"),
            "clicks",
            {"d": ("page", "user")},
            False,
            {"d": deduplicates(ttl="1 day")},
        )
