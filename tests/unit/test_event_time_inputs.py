"""Watermarks of several inputs (the minimum, with idle inputs left out), in ``_metadata``, and on sources."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_checkpoint.core import metadata
from airflow_provider_checkpoint.core.event_time import InputProgress, WatermarkProgress, combine
from airflow_provider_checkpoint.dataflow import FileSource, Transform, Union, WindowAggregate, tumbling
from airflow_provider_checkpoint.exceptions import MetadataError, PipelineDefinitionError
from tests.unit.helpers import sample

BOUNDS = {"a": 10, "b": 10}
MINUTE = 60_000


def run(steps: list[tuple[int, dict[str, int | None]]], idle_after: int | None) -> list[int | None]:
    """The combined watermark after each ``(barrier time, greatest time per input)``."""
    progress, marks = WatermarkProgress(), []
    for now, seen in steps:
        progress = combine(progress, seen, BOUNDS, now, idle_after)
        marks.append(progress.watermark)
    return marks


def test_the_watermark_is_the_minimum_of_the_inputs() -> None:
    assert run([(0, {"a": 1000, "b": None}), (1, {"a": None, "b": 500}), (2, {"a": 2000, "b": 600})], None) == [
        None,  # b has no watermark yet: nothing is closed
        490,
        590,
    ]


def test_without_idleness_a_quiet_input_holds_the_watermark() -> None:
    marks = run([(t * MINUTE, {"a": 1000 * (t + 1), "b": 500 if t == 0 else None}) for t in range(5)], None)
    assert marks == [490] * 5


def test_an_idle_input_is_left_out_until_it_has_rows_and_cannot_move_the_watermark_back() -> None:
    steps: list[tuple[int, dict[str, int | None]]] = [
        (0, {"a": 1000, "b": 500}),
        (1 * MINUTE, {"a": 2000, "b": None}),  # b quiet for 1 minute: not idle yet
        (2 * MINUTE, {"a": 3000, "b": None}),  # 2 minutes: idle, a alone
        (3 * MINUTE, {"a": None, "b": 700}),  # b is back, behind: the watermark holds
        (4 * MINUTE, {"a": 4000, "b": 5000}),  # b caught up: the minimum again
    ]
    assert run(steps, 2 * MINUTE) == [490, 490, 2990, 2990, 3990]


def test_an_input_that_never_had_rows_holds_the_watermark_until_it_is_idle() -> None:
    steps: list[tuple[int, dict[str, int | None]]] = [(t * MINUTE, {"a": 1000 * (t + 1), "b": None}) for t in range(4)]
    assert run(steps, 2 * MINUTE) == [None, None, 2990, 3990]


def test_when_every_input_is_idle_the_watermark_holds() -> None:
    steps: list[tuple[int, dict[str, int | None]]] = [
        (0, {"a": 1000, "b": 2000}),
        (5 * MINUTE, {"a": None, "b": None}),
        (9 * MINUTE, {"a": None, "b": None}),
    ]
    assert run(steps, MINUTE) == [990, 990, 990]


def test_the_progress_of_each_input_is_kept_and_an_input_removed_is_forgotten() -> None:
    after = combine(WatermarkProgress(), {"a": 1000, "b": None}, BOUNDS, 7, None)
    assert after == WatermarkProgress(
        1000, None, (("a", InputProgress(1000, 990, 7)), ("b", InputProgress(None, None, 7)))
    )
    assert combine(after, {"a": None}, {"a": 10}, 9, None) == WatermarkProgress(
        1000, 990, (("a", InputProgress(1000, 990, 7)),)
    )


times = st.one_of(st.none(), st.integers(0, 10**9))


@given(st.lists(st.tuples(times, times), max_size=15), st.one_of(st.none(), st.integers(1, 5)))
def test_the_combined_watermark_is_monotonic_and_never_above_an_input_that_is_awake(
    seen: list[tuple[int | None, int | None]], idle_after: int | None
) -> None:
    progress, previous, tops = WatermarkProgress(), None, {"a": [], "b": []}  # type: dict[str, list[int]]
    quiet = {"a": 0, "b": 0}  # checkpoints since each input last had rows
    for now, (a, b) in enumerate(seen):
        progress = combine(progress, {"a": a, "b": b}, BOUNDS, now, idle_after)
        for uid, top in (("a", a), ("b", b)):
            quiet[uid] = 0 if top is not None else quiet[uid] + 1
            if top is not None:
                tops[uid].append(top)
        mark = progress.watermark
        if previous is not None:
            assert mark is not None and mark >= previous
        if idle_after is None and all(tops.values()):  # no idleness: exactly the smaller input watermark
            assert mark == min(max(ts) - 10 for ts in tops.values())
        if mark is not None and mark != previous:  # it moved: no awake input is behind it
            for uid in ("a", "b"):
                if idle_after is None or quiet[uid] < idle_after:
                    assert tops[uid] and mark <= max(tops[uid]) - 10
        previous = mark
    assert progress.max_event_time == max((t for ts in tops.values() for t in ts), default=None)


def test_the_progress_of_each_input_goes_through_metadata() -> None:
    original = sample()
    progress = combine(WatermarkProgress(), {"a": 5_000, "b": None}, BOUNDS, 1_000, None)
    counts = dataclasses.replace(original.operators["counts"], event_time=progress)
    checkpoint = dataclasses.replace(original, operators={**original.operators, "counts": counts})
    assert metadata.decode(metadata.encode(checkpoint)) == checkpoint
    stored = json.loads(metadata.encode(checkpoint))["operators"]["counts"]["event_time"]
    assert stored == {
        "max_event_time": 5_000,
        "watermark": None,
        "inputs": {
            "a": {"max_event_time": 5_000, "watermark": 4_990, "active_at": 1_000},
            "b": {"max_event_time": None, "watermark": None, "active_at": 1_000},
        },
    }


@pytest.mark.parametrize(
    "inputs",
    [
        {"a": {"max_event_time": 10, "watermark": 0}},  # no active_at
        {"a": {"max_event_time": 10, "watermark": 20, "active_at": 0}},
        {"a": {"max_event_time": 99, "watermark": 0, "active_at": 0}},  # after the operator's
        {"../a": {"max_event_time": 10, "watermark": 0, "active_at": 0}},
        {"a": {"max_event_time": 10, "watermark": 0, "active_at": -1}},
        [],
    ],
)
def test_a_bad_input_progress_in_metadata_is_refused(inputs: object) -> None:
    doc = json.loads(metadata.encode(sample()))
    doc["operators"]["counts"]["event_time"] = {"max_event_time": 10, "watermark": 0, "inputs": inputs}
    with pytest.raises(MetadataError, match="event_time"):
        metadata.decode(json.dumps(doc).encode(), source="chk-7/_metadata")


def source(uid: str, watermark: tuple[str, str] | None = ("ts", "10 minutes")) -> FileSource:
    return FileSource(uid=uid, path="/tmp/x", format="json", schema="k STRING, ts TIMESTAMP", watermark=watermark)


def window(input: object, **kw: object) -> WindowAggregate:
    return WindowAggregate(
        uid="w", input=input, keys=["k"], time_column="ts", window=tumbling("5 minutes"), aggs={"n": "count"}, **kw
    )  # type: ignore[arg-type]


def test_a_window_takes_the_watermark_of_its_sources_through_transforms_and_unions() -> None:
    one = window(Transform("t", source("a"), lambda df: df))
    assert one.bounds == {"t": 600_000}
    both = window(Union("u", [source("a"), source("b", ("ts", "1 minute"))]), idle_after="1 hour")
    assert both.bounds == {"a": 600_000, "b": 60_000} and both.idle_after_ms == 3_600_000
    assert both.describe()["watermark"] == ["ts", {"a": 600_000, "b": 60_000}]
    own = window(Union("u", [source("a"), source("b", None)]), watermark=("ts", "2 minutes"))
    assert own.bounds == {"a": 120_000, "b": 120_000}  # the operator's own applies to every input


@pytest.mark.parametrize(
    ("build", "error"),
    [
        (lambda: window(source("a", None)), r"w: no watermark for input a: give watermark=\('ts'"),
        (lambda: window(Union("u", [source("a"), source("b", None)])), "no watermark for input b"),
        (lambda: window(source("a", ("other", "1 s"))), r"watermark column 'other' \(of input a\) must be"),
        (lambda: window(source("a"), idle_after="1 hour"), "idle_after needs several inputs"),
        (lambda: window(Union("u", [source("a"), source("b")]), idle_after="soon"), "w idle_after: 'soon'"),
        (lambda: source("a", ("ts", "ten")), "a watermark bound"),
    ],
)
def test_bad_watermarks_are_refused_with_the_fix(build: object, error: str) -> None:
    with pytest.raises(PipelineDefinitionError, match=error):
        build()  # type: ignore[operator]
