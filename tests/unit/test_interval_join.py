"""``IntervalJoin``'s definition: on event time (durations) or on numbers, and the watermarks it needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_provider_checkpoint.dataflow import FileSource, IntervalJoin
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError


def test_the_join_on_event_time_is_declared_with_durations_and_watermarks(tmp_path: Path) -> None:
    clicks = FileSource(
        "c", str(tmp_path), "json", "user STRING, click_ts TIMESTAMP", watermark=("click_ts", "1 minute")
    )
    plain = FileSource("p", str(tmp_path), "json", "user STRING, buy_ts TIMESTAMP")
    elsewhere = FileSource(
        "e", str(tmp_path), "json", "user STRING, at TIMESTAMP, buy_ts TIMESTAMP", watermark=("at", "1 minute")
    )

    def join(right: FileSource, **kw: Any) -> IntervalJoin:
        given: dict[str, Any] = {"lower": "-1 minute", "upper": "5 minutes", **kw}
        return IntervalJoin("j", clicks, right, ["user"], "click_ts", "buy_ts", **given)

    assert (join(plain, out_of_orderness="30 s").lower, join(plain, out_of_orderness="30 s").upper) == (
        -60_000,
        300_000,
    )
    assert join(plain, out_of_orderness="30 s").bounds == {"c": 30_000, "p": 30_000}
    cases: list[tuple[dict[str, Any], str]] = [
        ({}, "no watermark for input p: give out_of_orderness='1 minute' here"),
        ({"lower": 0}, "lower and upper must both be durations"),
        ({"upper": "-2 minutes", "out_of_orderness": "1 s"}, "lower bound -1 minute is above upper bound -2 minutes"),
        ({"out_of_orderness": 5}, "out_of_orderness must be a duration"),
        ({"upper": "5 fortnights", "out_of_orderness": "1 s"}, "j upper: '5 fortnights' is not a duration"),
    ]
    for kw, message in cases:
        with pytest.raises(PipelineDefinitionError, match=f"^j: .*{message}|{message}"):
            join(plain, **kw)
    with pytest.raises(
        PipelineDefinitionError, match="watermark column 'at' of input e must be its time column 'buy_ts'"
    ):
        join(elsewhere)
    with pytest.raises(PipelineDefinitionError, match="idle_after needs the join on event time"):
        IntervalJoin("j", clicks, plain, ["user"], "click_ts", "buy_ts", 0, 10, idle_after="1 minute")


def test_the_pipeline_check_finds_a_time_column_that_is_not_a_timestamp(tmp_path: Path) -> None:
    from airflow_provider_checkpoint.dataflow.validation import validate_pipeline

    left = FileSource(
        "c", str(tmp_path / "c"), "json", "user STRING, click_ts LONG", watermark=("click_ts", "1 minute")
    )
    right = FileSource("b", str(tmp_path / "b"), "json", "user STRING, buy_ts TIMESTAMP")
    joined = IntervalJoin("j", left, right, ["user"], "click_ts", "buy_ts", "0 s", "5 minutes", "1 minute")
    found = [(p.uid, p.field, p.message) for p in validate_pipeline([left, right, joined])]
    assert ("j", "left_time", "'click_ts' is bigint, not a timestamp") in found, found
