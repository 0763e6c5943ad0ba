"""The watermark rule, durations, the watermark in ``_metadata``, and window definitions."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_checkpoint.core import metadata
from airflow_provider_checkpoint.core.event_time import MAX_EVENT_TIME, WatermarkProgress, WatermarkSpec, duration_ms
from airflow_provider_checkpoint.dataflow import (
    FileSource,
    ParquetTableSink,
    WindowAggregate,
    session,
    sliding,
    tumbling,
)
from airflow_provider_checkpoint.dataflow.validation import validate_pipeline
from airflow_provider_checkpoint.exceptions import MetadataError, PipelineDefinitionError
from tests.unit.helpers import sample


@pytest.mark.parametrize(
    ("text", "ms"),
    [("10 minutes", 600_000), ("30s", 30_000), ("1 hour", 3_600_000), ("500 ms", 500), ("2 days", 172_800_000)],
)
def test_durations(text: str, ms: int) -> None:
    assert duration_ms(text, "bound") == ms


@pytest.mark.parametrize("text", ["10", "ten minutes", "5 fortnights", "-1 s", "1.5 h", ""])
def test_a_bad_duration_names_the_parameter_and_the_form(text: str) -> None:
    with pytest.raises(PipelineDefinitionError, match=r"gap: .* e\.g\. '10 minutes'"):
        duration_ms(text, "gap")


def test_the_watermark_trails_the_greatest_time_by_the_bound_and_never_moves_back() -> None:
    start = WatermarkProgress()
    assert start.advance(None, 10) == start  # no rows, no watermark
    first = start.advance(1000, 10)
    assert first == WatermarkProgress(1000, 990)
    assert first.advance(500, 10) == first  # older rows keep it
    assert first.advance(None, 10) == first  # an empty checkpoint keeps it
    assert first.advance(2000, 10) == WatermarkProgress(2000, 1990)
    assert first.closes(990) and not first.closes(991) and not start.closes(0)


@given(st.lists(st.one_of(st.none(), st.integers(-(10**12), 10**12)), max_size=20), st.integers(0, 10**9))
def test_the_watermark_is_monotonic_and_follows_the_maximum(seen: list[int | None], bound: int) -> None:
    progress, marks = WatermarkProgress(), []
    for s in seen:
        progress = progress.advance(s, bound)
        marks.append(progress.watermark)
    times = [s for s in seen if s is not None]
    assert progress.max_event_time == (max(times) if times else None)
    assert progress.watermark == (max(times) - bound if times else None)
    known = [m for m in marks if m is not None]
    assert known == sorted(known)


def test_the_snapshot_keeps_the_watermark_through_metadata() -> None:
    original = sample()
    counts = dataclasses.replace(original.operators["counts"], event_time=WatermarkProgress(5_000, 4_000))
    checkpoint = dataclasses.replace(original, operators={**original.operators, "counts": counts})
    assert metadata.decode(metadata.encode(checkpoint)) == checkpoint
    assert "event_time" not in json.loads(metadata.encode(original))["operators"]["counts"]


@pytest.mark.parametrize(
    "event_time",
    [
        {"max_event_time": 10, "watermark": 20},
        {"max_event_time": 10},
        {"max_event_time": None, "watermark": 5},
        {"max_event_time": "10", "watermark": 0},
        {"max_event_time": MAX_EVENT_TIME + 1, "watermark": 0},
        [10, 0],
    ],
)
def test_a_bad_watermark_in_metadata_is_refused(event_time: object) -> None:
    doc = json.loads(metadata.encode(sample()))
    doc["operators"]["counts"]["event_time"] = event_time
    with pytest.raises(MetadataError, match="event_time"):
        metadata.decode(json.dumps(doc).encode(), source="chk-7/_metadata")


def test_watermark_spec() -> None:
    assert WatermarkSpec.of(("ts", "10 minutes"), "w") == WatermarkSpec("ts", 600_000)
    with pytest.raises(PipelineDefinitionError, match=r"w: watermark must be \(column, bound\)"):
        WatermarkSpec.of("ts", "w")


def test_window_shapes() -> None:
    assert tumbling("5 minutes") == dataclasses.replace(sliding("5 minutes", "5 minutes"), kind="tumbling")
    assert session("30 minutes").gap_ms == 1_800_000
    with pytest.raises(PipelineDefinitionError, match="must not exceed size"):
        sliding("5 minutes", "10 minutes")
    with pytest.raises(PipelineDefinitionError, match="must be positive"):
        session("0 s")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"watermark": ("other", "1 minute")}, "must be the time column 'ts'"),
        ({"emit": "always"}, "emit must be 'final' or 'update'"),
        ({"emit": "update", "window": session("5 minutes")}, "not supported for session windows"),
        ({"late": "late_table"}, "late must be 'drop' or 'output'"),
        ({"aggs": {"window_end": "count"}}, "window's own columns"),
        ({"allowed_lateness": "soon"}, "allowed_lateness"),
    ],
)
def test_a_bad_window_aggregate_is_refused_with_the_fix(kwargs: dict[str, object], message: str) -> None:
    events = FileSource("events", "/tmp/in", "json", "user STRING, ts TIMESTAMP")
    arguments: dict[str, object] = {
        "keys": ["user"],
        "time_column": "ts",
        "window": tumbling("5 minutes"),
        "aggs": {"n": "count"},
        "watermark": ("ts", "1 minute"),
        **kwargs,
    }
    with pytest.raises(PipelineDefinitionError, match=message):
        WindowAggregate("w", events, **arguments)  # type: ignore[arg-type]


def test_the_window_columns_key_the_output() -> None:
    events = FileSource("events", "/tmp/in", "json", "user STRING, ts TIMESTAMP")
    agg = WindowAggregate("w", events, ["user"], "ts", tumbling("5 minutes"), {"n": "count"}, ("ts", "1 minute"))
    assert agg.unique_keys() == ("user", "window_start", "window_end")
    assert agg.describe()["window"] == "tumbling(size=300000 ms, slide=300000 ms)"


def test_a_window_aggregate_is_validated_when_the_dag_is_parsed(tmp_path: Path) -> None:
    source = FileSource("events", str(tmp_path / "in"), "json", "user STRING, ts TIMESTAMP, amount LONG")
    good = WindowAggregate("w", source, ["user"], "ts", tumbling("5 minutes"), {"n": "sum(amount)"}, ("ts", "1 s"))
    keys = ["user", "window_start", "window_end"]
    sink = ParquetTableSink("out", good, str(tmp_path / "out"), mode="upsert", keys=keys)
    assert validate_pipeline([source, good, sink]) == []

    longs = FileSource("longs", str(tmp_path / "in2"), "json", "user STRING, ts LONG")
    bad = WindowAggregate("v", longs, ["usr"], "ts", tumbling("5 minutes"), {"n": "max(amt)"}, ("ts", "1 s"))
    found = validate_pipeline([longs, bad])
    assert [(p.uid, p.field) for p in found] == [("v", "keys"), ("v", "aggs"), ("v", "time_column")]
    assert "'ts' is bigint, not a timestamp; cast it in a Transform first" in str(found[2])
