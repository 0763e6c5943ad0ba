"""State that expires: the rules of ``core/ttl.py``, the definitions of ``ttl=`` and ``Deduplicate``, and the
watermark they take from the sources upstream."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_checkpoint.core.event_time import WatermarkProgress
from airflow_provider_checkpoint.core.ttl import TTL, Clocks, live, renewed
from airflow_provider_checkpoint.dataflow import (
    Deduplicate,
    FileSource,
    KeyedAggregate,
    KeyedProcess,
    KeyedProcessFunction,
    ParquetTableSink,
    Transform,
    ValueState,
)
from airflow_provider_checkpoint.dataflow.validation import validate_pipeline
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

SCHEMA = "user STRING, ts TIMESTAMP, amount LONG"


def test_a_key_lives_until_its_clock_reaches_its_expiry() -> None:
    assert live(1_000, 999) and not live(1_000, 1_000) and not live(1_000, 5_000)
    assert live(1_000, None), "no clock yet (no watermark): nothing has expired"
    assert live(None, 10**15), "no expiry: lives"


@given(st.integers(0, 10**12), st.integers(0, 10**12), st.integers(1, 10**9))
def test_an_update_never_shortens_a_life(old: int, stamp: int, ttl: int) -> None:
    new = renewed(old, stamp, ttl)
    assert new >= old and new >= stamp + ttl and new in (old, stamp + ttl)
    assert renewed(None, stamp, ttl) == stamp + ttl


def test_the_clocks_of_a_checkpoint() -> None:
    processing = Clocks.of_checkpoint(1_700_000_000.2496)  # rounded to the ms, not cut
    assert processing == Clocks(None, None, 1_700_000_000_250)
    assert (processing.read("processing"), processing.keep("processing")) == (1_700_000_000_250,) * 2
    assert (processing.read("event"), processing.keep("event")) == (None, None)  # no watermark: nothing expires
    before, after = WatermarkProgress(100, 40), WatermarkProgress(300, 240)
    event = Clocks.of_checkpoint(5.0, before, after)
    assert event == Clocks(40, 240, 5000)
    assert (event.read("event"), event.keep("event"), event.keep("processing")) == (40, 240, 5000)
    assert Clocks.of_checkpoint(5.0, WatermarkProgress(), WatermarkProgress()) == Clocks(None, None, 5000)


def test_a_ttl_parses_and_names_its_mistakes() -> None:
    assert TTL.of("1 hour", "agg") == TTL("1 hour", "processing", "on_write")
    assert TTL.of("1 hour", "agg").ms == 3_600_000
    assert TTL.of(TTL("5 min", time="event", update="on_read_and_write"), "agg").describe() == {
        "ttl_ms": 300_000,
        "time": "event",
        "update": "on_read_and_write",
    }
    with pytest.raises(PipelineDefinitionError, match="agg: ttl must be positive"):
        TTL.of("0 s", "agg")
    with pytest.raises(PipelineDefinitionError, match="agg ttl: 'soon' is not a duration"):
        TTL.of(TTL("soon"), "agg")
    with pytest.raises(
        PipelineDefinitionError, match="agg: TTL time must be one of processing, event, got 'event_time'"
    ):
        TTL.of(TTL("1 h", "event_time"), "agg")
    with pytest.raises(PipelineDefinitionError, match="agg: TTL update must be one of on_write, on_read_and_write"):
        TTL.of(TTL("1 h", update="on_read"), "agg")
    with pytest.raises(PipelineDefinitionError, match=r"agg: ttl must be a duration such as '1 day' or a TTL\("):
        TTL.of(3600, "agg")


def test_keyed_aggregate_ttl_is_checked_when_defined(tmp_path: Path) -> None:
    events = FileSource("events", str(tmp_path), "json", SCHEMA)
    with pytest.raises(PipelineDefinitionError, match=r"a: an event-time TTL needs a watermark and input events has"):
        KeyedAggregate("a", events, ["user"], {"n": "count"}, ttl=TTL("1 h", time="event"))
    with pytest.raises(PipelineDefinitionError, match="b: watermark= is used by an event-time TTL only"):
        KeyedAggregate("b", events, ["user"], {"n": "count"}, watermark=("ts", "1 min"))
    timed = KeyedAggregate(
        "c", events, ["user"], {"n": "count"}, ttl=TTL("1 h", time="event"), watermark=("ts", "1 min")
    )
    assert timed.describe()["ttl"] == {"ttl_ms": 3_600_000, "time": "event", "update": "on_write"}
    assert timed.describe()["watermark"] == ["ts", 60_000]
    assert not timed.reads_input_once, "read for the watermark, then for the aggregates"
    plain = KeyedAggregate("d", events, ["user"], {"n": "count"}, ttl="1 h")
    assert plain.reads_input_once and "watermark" not in plain.describe()


def test_deduplicate_is_checked_when_defined(tmp_path: Path) -> None:
    events = FileSource("events", str(tmp_path), "json", SCHEMA)
    with pytest.raises(PipelineDefinitionError, match="d: within must be positive"):
        Deduplicate("d", events, ["user"], within="0 s", watermark=("ts", "1 min"))
    with pytest.raises(PipelineDefinitionError, match="d within: 'a day' is not a duration"):
        Deduplicate("d", events, ["user"], within="a day", watermark=("ts", "1 min"))
    with pytest.raises(PipelineDefinitionError, match="e: watermark must be"):
        Deduplicate("e", events, ["user"], within="1 h", watermark="ts")  # type: ignore[arg-type]
    dedup = Deduplicate("f", events, ["user"], within="1 h", watermark=("ts", "10 min"))
    assert dedup.unique_keys() is None, "a key is emitted again once its state expired"
    assert dedup.describe()["within_ms"] == 3_600_000
    assert "late" not in dedup.describe(), "late='drop' is the default"


def test_deduplicate_by_processing_time_takes_ttl_instead_of_within(tmp_path: Path) -> None:
    events = FileSource("events", str(tmp_path / "in"), "json", SCHEMA)
    one_of = "give within= .event time, e.g. '1 day'. or ttl= .processing time., one of them"
    with pytest.raises(PipelineDefinitionError, match=f"^d: {one_of}"):
        Deduplicate("d", events, ["user"])
    with pytest.raises(PipelineDefinitionError, match=f"^d: {one_of}"):
        Deduplicate("d", events, ["user"], within="1 h", ttl="1 h", watermark=("ts", "1 min"))
    with pytest.raises(
        PipelineDefinitionError, match="^d: ttl= expires by processing time; for event time use within="
    ):
        Deduplicate("d", events, ["user"], ttl=TTL("1 h", time="event"))
    with pytest.raises(PipelineDefinitionError, match="^d: watermark= and late= go with within="):
        Deduplicate("d", events, ["user"], ttl="1 h", watermark=("ts", "1 min"))
    with pytest.raises(PipelineDefinitionError, match="^d: watermark= and late= go with within="):
        Deduplicate("d", events, ["user"], ttl="1 h", late="output")
    with pytest.raises(PipelineDefinitionError, match="^d: ttl must be positive"):
        Deduplicate("d", events, ["user"], ttl="0 s")
    dedup = Deduplicate("e", events, ["user"], ttl=TTL("1 h", update="on_read_and_write"))
    assert dedup.watermark is None, "no watermark needed, none taken"
    assert dedup.describe()["ttl"] == {"ttl_ms": 3_600_000, "time": "processing", "update": "on_read_and_write"}
    sink = ParquetTableSink("out", dedup, str(tmp_path / "out"), mode="append")
    assert validate_pipeline([events, dedup, sink]) == []


def test_deduplicate_late_output_is_a_second_output_only_when_asked_for(tmp_path: Path) -> None:
    events = FileSource("events", str(tmp_path / "in"), "json", SCHEMA)
    with pytest.raises(PipelineDefinitionError, match="^d: late must be 'drop' or 'output', got 'keep'"):
        Deduplicate("d", events, ["user"], within="1 h", watermark=("ts", "1 min"), late="keep")
    dropping = Deduplicate("e", events, ["user"], within="1 h", watermark=("ts", "1 min"))
    with pytest.raises(PipelineDefinitionError, match="^e: late_data needs late='output'"):
        dropping.late_data  # noqa: B018
    dedup = Deduplicate("f", events, ["user"], within="1 h", watermark=("ts", "1 min"), late="output")
    assert dedup.late_data is dedup.late_data and dedup.late_data.uid == "f.late"
    assert dedup.describe()["late"] == "output"
    with pytest.raises(PipelineDefinitionError, match="^f: its late rows are read before the operator ran"):
        dedup.late_rows()
    sink = ParquetTableSink("late_out", dedup.late_data, str(tmp_path / "late"), mode="append")
    assert validate_pipeline([events, dedup, dedup.late_data, sink]) == []


def test_expiring_operators_are_validated_when_the_dag_is_parsed(tmp_path: Path) -> None:
    events = FileSource("events", str(tmp_path / "in"), "json", SCHEMA)
    agg = KeyedAggregate("agg", events, ["user"], {"n": "count"}, ttl=TTL("1 h", time="event"), watermark=("ts", "1 s"))
    dedup = Deduplicate("dedup", events, ["user"], within="1 h", watermark=("ts", "1 s"))
    sink = ParquetTableSink("out", dedup, str(tmp_path / "out"), mode="append")
    assert validate_pipeline([events, agg, dedup, sink]) == []

    longs = FileSource("longs", str(tmp_path / "in2"), "json", "user STRING, ts LONG")
    bad_agg = KeyedAggregate("a", longs, ["user"], {"n": "count"}, ttl=TTL("1 h", time="event"), watermark=("t", "1 s"))
    bad_dedup = Deduplicate("d", longs, ["usr"], within="1 h", watermark=("ts", "1 s"))
    found = validate_pipeline([longs, bad_agg, bad_dedup])
    assert [(p.uid, p.field) for p in found] == [("a", "watermark"), ("d", "keys"), ("d", "watermark")]
    assert "'ts' is bigint, not a timestamp; cast it in a Transform first" in str(found[2])


class _LastSeen(KeyedProcessFunction):
    output_schema = "user STRING"
    states = (ValueState("seen", "long", ttl=TTL("1 day", time="event")),)

    def process(self, key: tuple[object, ...], rows: object, ctx: object) -> None:
        return None


def test_the_watermark_is_taken_from_the_sources_upstream_when_not_given(tmp_path: Path) -> None:
    timed = FileSource("timed", str(tmp_path / "a"), "json", SCHEMA, watermark=("ts", "10 s"))
    cleaned = Transform("cleaned", timed, lambda df: df)
    agg = KeyedAggregate("agg", cleaned, ["user"], {"n": "count"}, ttl=TTL("1 h", time="event"))
    dedup = Deduplicate("dedup", cleaned, ["user"], within="1 h")
    proc = KeyedProcess("proc", cleaned, ["user"], _LastSeen())
    for node in (agg, dedup, proc):
        assert node.describe()["watermark"] == ["ts", 10_000], node.uid
    own = Deduplicate("own", timed, ["user"], within="1 h", watermark=("ts", "1 min"))
    assert own.describe()["watermark"] == ["ts", 60_000], "a watermark given wins over the source's"
    assert "watermark" not in KeyedAggregate("proc_ttl", timed, ["user"], {"n": "count"}, ttl="1 h").describe()
    assert validate_pipeline([timed, cleaned, agg, dedup, proc]) == []


def test_no_watermark_given_nor_upstream_is_refused_when_defined(tmp_path: Path) -> None:
    plain = FileSource("plain", str(tmp_path / "a"), "json", SCHEMA)
    timed = FileSource("timed", str(tmp_path / "b"), "json", SCHEMA, watermark=("ts", "10 s"))
    behind_state = KeyedAggregate("counts", timed, ["user"], {"n": "count"})
    fix = r"give watermark=\(time_column, bound\) here, e.g. \('ts', '10 minutes'\), or watermark= on the source"
    with pytest.raises(
        PipelineDefinitionError, match=f"^d: Deduplicate needs a watermark and input plain has none: {fix}"
    ):
        Deduplicate("d", plain, ["user"], within="1 h")
    with pytest.raises(PipelineDefinitionError, match="^e: Deduplicate needs a watermark and input counts has none"):
        Deduplicate("e", behind_state, ["user"], within="1 h")  # a stateful operator does not pass it on
    with pytest.raises(PipelineDefinitionError, match=r"^p: state \['seen'\] with an event-time TTL needs a watermark"):
        KeyedProcess("p", plain, ["user"], _LastSeen())
    assert KeyedProcess("q", plain, ["user"], _Untimed()).watermark is None, "processing time only: none needed"


class _Untimed(KeyedProcessFunction):
    output_schema = "user STRING"
    states = (ValueState("seen", "long", ttl="1 day"),)

    def process(self, key: tuple[object, ...], rows: object, ctx: object) -> None:
        return None
