"""Dead-letter settings: validation, the pipeline's defaults, where the dead-letter sink runs,
and how a malformed record's line and reason are found (no Spark)."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest

from airflow_provider_checkpoint.connectors.files.dead_letters import DeadLetterSink, locate, reason
from airflow_provider_checkpoint.dataflow import FileSource, KeyedAggregate, ParquetTableSink
from airflow_provider_checkpoint.dataflow.defaults import SourceDefaults
from airflow_provider_checkpoint.dataflow.planner import PipelineGraph
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError
from airflow_provider_checkpoint.spark.step_reads import _only_consumers, _read_once

SCHEMA = "user STRING, page STRING, ts LONG"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"on_malformed": "drop"}, r"events: on_malformed must be one of \('fail', 'dead_letter'\), got 'drop'"),
        ({"max_malformed_fraction": 1.5}, r"events: max_malformed_fraction must be in \[0, 1\], got 1\.5"),
        ({"max_malformed_fraction": "half"}, r"events: max_malformed_fraction must be a number, got 'half'"),
        (
            {"on_malformed": "fail", "dead_letter_path": "/x"},
            r"events: dead_letter_path needs on_malformed='dead_letter'",
        ),
        ({"format": "parquet", "on_malformed": "dead_letter"}, r"events: on_malformed='dead_letter' applies to json"),
    ],
)
def test_bad_source_settings_are_refused_naming_the_source_and_the_rule(tmp_path: Path, settings, message) -> None:
    kwargs = {"format": "json", **settings}
    with pytest.raises(PipelineDefinitionError, match=message):
        FileSource("events", str(tmp_path), schema=SCHEMA, **kwargs)


def test_bad_pipeline_defaults_are_refused() -> None:
    with pytest.raises(PipelineDefinitionError, match=r"pipeline: on_malformed must be one of"):
        SourceDefaults(on_malformed="skip")
    with pytest.raises(PipelineDefinitionError, match=r"pipeline: max_malformed_fraction must be in \[0, 1\]"):
        SourceDefaults(max_malformed_fraction=-0.1)


def test_checkpointed_pipeline_refuses_a_bad_on_malformed() -> None:
    from airflow_provider_checkpoint.pipeline import CheckpointedPipeline

    with pytest.raises(PipelineDefinitionError, match=r"pipeline: on_malformed must be one of"):
        CheckpointedPipeline("bad_malformed", on_malformed="ignore")


def test_dead_letters_need_a_table(tmp_path: Path) -> None:
    src = FileSource("events", str(tmp_path / "landing"), "json", SCHEMA, on_malformed="dead_letter")
    sink = ParquetTableSink("out", src, str(tmp_path / "out"))
    with pytest.raises(PipelineDefinitionError, match="events: on_malformed='dead_letter' needs a dead-letter table"):
        PipelineGraph([src, sink])


def test_the_source_setting_wins_over_the_pipeline_default(tmp_path: Path) -> None:
    own = FileSource("own", str(tmp_path / "landing"), "json", SCHEMA, on_malformed="fail", max_malformed_fraction=0.1)
    inherits = FileSource("inherits", str(tmp_path / "landing"), "csv", SCHEMA)
    table = FileSource("table", str(tmp_path / "landing"), "json", SCHEMA, dead_letter_path=str(tmp_path / "mine"))
    sinks = [ParquetTableSink(f"{s.uid}_out", s, str(tmp_path / s.uid)) for s in (own, inherits, table)]
    defaults = SourceDefaults("dead_letter", 0.3, str(tmp_path / "dead"))
    graph = PipelineGraph([own, inherits, table, *sinks], defaults)
    assert (own.on_malformed, own.max_malformed_fraction) == ("fail", 0.1)
    assert (inherits.on_malformed, inherits.max_malformed_fraction) == ("dead_letter", 0.3)
    dead = {s.uid: s.path for s in graph.sinks if isinstance(s, DeadLetterSink)}
    assert dead == {
        "inherits.dead_letters": str(tmp_path / "dead" / "inherits"),
        "table.dead_letters": str(tmp_path / "mine"),
    }
    assert PipelineGraph([own, sinks[0]]).steps, "a graph without defaults: every source fails on malformed records"


def test_the_dead_letter_sink_runs_last_in_the_first_step_reading_its_source(tmp_path: Path) -> None:
    src = FileSource("events", str(tmp_path / "landing"), "json", SCHEMA, on_malformed="dead_letter")
    views = KeyedAggregate("views", src, keys=["page"], aggs={"n": "count"})
    users = KeyedAggregate("users", src, keys=["user"], aggs={"n": "count"})
    a = ParquetTableSink("views_out", views, str(tmp_path / "v"), mode="upsert", keys=["page"])
    b = ParquetTableSink("users_out", users, str(tmp_path / "u"), mode="upsert", keys=["user"])
    graph = PipelineGraph([src, views, users, a, b], SourceDefaults(dead_letter_path=str(tmp_path / "dead")))
    assert sorted(graph.steps) == ["step_users_out", "step_views_out"], "no step of its own"
    first, second = graph.steps.values()
    assert first[-1].uid == "events.dead_letters" and not any(isinstance(n, DeadLetterSink) for n in second)
    with_one_consumer = PipelineGraph([src, views, a], SourceDefaults(dead_letter_path=str(tmp_path / "dead")))
    (step,) = with_one_consumer.steps
    assert _read_once(_only_consumers(with_one_consumer, step)) == {"events": "views"}, (
        "the dead-letter sink does not stop it"
    )


def test_locate_numbers_repeated_malformed_lines_and_leaves_unmatched_ones_without_a_line(tmp_path: Path) -> None:
    path = tmp_path / "mixed.json"
    path.write_text('{"a": 1}\nbad\n{"a": 2}\r\nbad\nworse\n')
    fs = fsspec.filesystem("file")
    assert locate(fs, str(path), ["bad", "worse", "bad", "multi\nline"]) == [
        (2, "bad"),
        (4, "bad"),
        (5, "worse"),
        (None, "multi\nline"),
    ]


def test_reason_says_why_as_far_as_python_can_tell() -> None:
    assert reason("json", '{"a": ', SCHEMA, 3, {}).startswith("not valid JSON: ")
    assert reason("json", "[1, 2]", SCHEMA, 3, {}) == "not a JSON object: list"
    assert reason("json", '{"ts": "x"}', SCHEMA, 3, {}) == f"does not match schema <{SCHEMA}>"
    assert reason("csv", "a;b", SCHEMA, 3, {"sep": ";"}) == f"has 2 fields, schema <{SCHEMA}> has 3"
    assert reason("csv", "a,b,x", SCHEMA, 3, {}) == f"a field does not match schema <{SCHEMA}>"
