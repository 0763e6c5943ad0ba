"""Mistakes a pipeline's definition shows when the DAG file is parsed, without a JVM (dataflow.validation)."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_checkpoint.dataflow import (
    DeltaSource,
    DeltaTableSink,
    DimensionEnrichment,
    FileSource,
    IntervalJoin,
    KafkaSource,
    KeyedAggregate,
    KeyedStateFunction,
    ParquetTableSink,
    PostgresTableSink,
    Transform,
    Union,
)
from airflow_provider_checkpoint.dataflow.channel import Channel
from airflow_provider_checkpoint.dataflow.graph import Node, collecting
from airflow_provider_checkpoint.dataflow.planner import PipelineGraph
from airflow_provider_checkpoint.dataflow.schema_ddl import DdlError, parse_schema
from airflow_provider_checkpoint.dataflow.validation import Problem, validate_pipeline
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

SCHEMA = "user STRING, ts LONG"


def problems(nodes: list[Node]) -> list[Problem]:
    return validate_pipeline(nodes)


def events(tmp_path: Path, schema: str = SCHEMA, uid: str = "events") -> FileSource:
    return FileSource(uid=uid, path=str(tmp_path / "landing" / uid), format="json", schema=schema)


# -- the DDL ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("ddl", "columns"),
    [
        ("user STRING, ts LONG", [("user", "string"), ("ts", "bigint")]),
        ("`a b` STRING, `x``y` INT NOT NULL COMMENT 'the ''x''' ", [("a b", "string"), ("x`y", "int")]),
        (
            "s STRUCT<a: INT NOT NULL, b ARRAY<MAP<STRING, DECIMAL(5,2)>>>",
            [("s", "struct<a:int,b:array<map<string,decimal(5,2)>>>")],
        ),
        ("STRUCT<a: INT, b: STRING>", [("a", "int"), ("b", "string")]),
        ("t TIMESTAMP_NTZ, u timestamp_ltz, i INTERVAL DAY TO SECOND, v VARCHAR(3), c STRING COLLATE UTF8_LCASE", None),
        (
            "a TIMESTAMP WITH LOCAL TIME ZONE, b timestamp without time zone",
            [("a", "timestamp"), ("b", "timestamp_ntz")],
        ),
        ('h ARRAY<STRUCT<key: STRING, value: BINARY>>, `1a` INT COMMENT "x""y"', None),
    ],
)
def test_ddl_spark_accepts_is_read_with_names_and_types(ddl: str, columns: list[tuple[str, str]] | None) -> None:
    parsed = parse_schema(ddl)
    if columns is not None:
        assert [(c.name, c.type) for c in parsed] == columns
    assert all(c.type for c in parsed)


def test_ddl_type_aliases_read_as_spark_names_them() -> None:
    parsed = parse_schema("a integer, b Byte, c short, d real, e dec, f numeric(12, 3), g LONG, h Boolean")
    types = ["int", "tinyint", "smallint", "float", "decimal(10,0)", "decimal(12,3)", "bigint", "boolean"]
    assert [c.type for c in parsed] == types


@pytest.mark.parametrize(
    ("ddl", "position", "words"),
    [
        ("user STRNG, ts LONG", 6, ["unknown type 'STRNG'", "did you mean STRING", "known types: BOOLEAN"]),
        ("a INT,", 7, ["expected a column name"]),
        ("a INT b", 7, ["expected ','"]),
        ("a ARRAY<INT", 12, ["closing ARRAY<"]),
        ("a DECIMAL(40,2)", 3, ["precision"]),
        ("a INT, A LONG", 8, ["named twice"]),
        ("a MAP<STRING>", 13, ["between the key and value"]),
        ("a INT NOT", 10, ["NULL after NOT"]),
        ("", 1, ["at least one column"]),
        ("a INT; DROP", 6, ["unexpected character ';'"]),
    ],
)
def test_ddl_mistakes_are_refused_with_their_position(ddl: str, position: int, words: list[str]) -> None:
    with pytest.raises(DdlError) as caught:
        parse_schema(ddl)
    assert caught.value.position == position
    for word in words:
        assert word in str(caught.value)


# -- the mistakes of the issue ---------------------------------------------------------
def test_a_key_not_in_the_declared_schema_is_named_with_the_node_and_the_columns(tmp_path: Path) -> None:
    source = events(tmp_path)
    agg = KeyedAggregate(uid="per_user", input=source, keys=["usr"], aggs={"n": "count"})
    sink = ParquetTableSink(uid="out", input=agg, path=str(tmp_path / "out"), mode="upsert", keys=["usr"])
    found = problems([source, agg, sink])
    assert [(p.uid, p.field) for p in found] == [("per_user", "keys")]
    assert "'usr' not among the columns of input events (user, ts)" in str(found[0])


def test_an_aggregated_column_not_in_the_schema_is_refused(tmp_path: Path) -> None:
    source = events(tmp_path)
    agg = KeyedAggregate(uid="per_user", input=source, keys=["user"], aggs={"n": "count", "last": "max(tss)"})
    sink = ParquetTableSink(uid="out", input=agg, path=str(tmp_path / "out"), mode="upsert", keys=["user"])
    found = problems([source, agg, sink])
    assert [(p.uid, p.field) for p in found] == [("per_user", "aggs")]
    assert "'tss'" in found[0].message


def test_the_ordering_column_of_a_two_column_aggregate_is_checked_too(tmp_path: Path) -> None:
    source = events(tmp_path)
    agg = KeyedAggregate(uid="per_user", input=source, keys=["user"], aggs={"latest": "last(user, tss)"})
    sink = ParquetTableSink(uid="out", input=agg, path=str(tmp_path / "out"), mode="upsert", keys=["user"])
    found = problems([source, agg, sink])
    assert [(p.uid, p.field) for p in found] == [("per_user", "aggs")]
    assert "'tss'" in found[0].message


def test_a_schema_typo_raises_at_build_time_with_the_position_and_the_known_types(tmp_path: Path) -> None:
    with collecting() as nodes:
        source = events(tmp_path, "user STRNG, ts LONG")
        ParquetTableSink(uid="out", input=source, path=str(tmp_path / "out"))
    with pytest.raises(PipelineDefinitionError) as caught:
        PipelineGraph(nodes)
    text = str(caught.value)
    assert "events: schema:" in text and "position 6" in text and "did you mean STRING" in text
    assert "known types:" in text and "correct schema" in text


def test_two_sinks_on_one_table_are_refused_naming_both(tmp_path: Path) -> None:
    source = events(tmp_path)
    first = ParquetTableSink(uid="first", input=source, path=str(tmp_path / "out"))
    second = ParquetTableSink(uid="second", input=source, path=f"file://{tmp_path}/x/../out/")
    found = problems([source, first, second])
    assert [(p.uid, p.field) for p in found] == [("second", "target")]
    assert "written by sink first too" in found[0].message


def test_two_postgres_sinks_on_one_table_of_a_connection_are_refused_another_connection_is_not(tmp_path: Path) -> None:
    source = events(tmp_path)
    a = PostgresTableSink(uid="a", input=source, conn_id="pg", table="public.t")
    b = PostgresTableSink(uid="b", input=source, conn_id="pg", table="t")
    c = PostgresTableSink(uid="c", input=source, conn_id="other", table="t")
    d = PostgresTableSink(uid="d", input=source, conn_id="pg", table="u", dead_letter_table="t")
    found = problems([source, a, b, c, d])
    assert [(p.uid, p.field) for p in found] == [("b", "target"), ("d", "target")]
    assert "postgres://pg/public.t is written by sink a too" in found[0].message


def test_everything_wrong_is_reported_at_once(tmp_path: Path) -> None:
    with collecting() as nodes:
        source = events(tmp_path)
        agg = KeyedAggregate(uid="per_user", input=source, keys=["usr"], aggs={"n": "count", "m": "max(tss)"})
        ParquetTableSink(uid="out", input=agg, path=str(tmp_path / "out"), mode="upsert", keys=["usr"])
        ParquetTableSink(uid="raw", input=source, path=str(tmp_path / "out"))
    with pytest.raises(PipelineDefinitionError) as caught:
        PipelineGraph(nodes)
    text = str(caught.value)
    assert "3 problem(s)" in text
    assert "- per_user: keys:" in text and "- per_user: aggs:" in text and "- raw: target:" in text


# -- what else a definition shows ------------------------------------------------------
def test_sink_keys_and_sequence_by_are_checked_against_what_reaches_the_sink(tmp_path: Path) -> None:
    source = events(tmp_path)
    agg = KeyedAggregate(uid="per_user", input=source, keys=["user"], aggs={"n": "count"})
    upsert = ParquetTableSink(
        uid="up", input=agg, path=str(tmp_path / "up"), mode="upsert", keys=["user"], sequence_by=["ts"]
    )
    delta = DeltaTableSink(uid="dl", input=source, path=str(tmp_path / "dl"), partition_by=["day"])
    found = problems([source, agg, upsert, delta])
    assert [(p.uid, p.field) for p in found] == [("up", "sequence_by"), ("dl", "partition_by")]
    assert "input per_user (user, n)" in found[0].message  # the aggregate's output columns


def test_names_resolve_case_insensitively_as_spark_does(tmp_path: Path) -> None:
    source = events(tmp_path, "User STRING, TS LONG")
    agg = KeyedAggregate(uid="per_user", input=source, keys=["user"], aggs={"last": "max(ts)"})
    sink = ParquetTableSink(uid="out", input=agg, path=str(tmp_path / "out"), mode="upsert", keys=["USER"])
    assert problems([source, agg, sink]) == []


def test_checks_stop_past_a_transform_and_a_user_function(tmp_path: Path) -> None:
    source = events(tmp_path)
    shaped = Transform(uid="shaped", input=source, fn=lambda df: df)
    agg = KeyedAggregate(uid="per_x", input=shaped, keys=["anything"], aggs={"n": "sum(whatever)"})
    fn = KeyedStateFunction(
        uid="fn", input=source, keys=["user"], fn=lambda i, s: (s, i), state_schema="user STRING, n LONG"
    )
    sinks = [
        ParquetTableSink(uid="a", input=agg, path=str(tmp_path / "a"), mode="upsert", keys=["anything"]),
        ParquetTableSink(uid="b", input=fn, path=str(tmp_path / "b"), mode="upsert", keys=["not_known_here"]),
    ]
    assert problems([source, shaped, agg, fn, *sinks]) == []


def test_a_state_function_s_state_schema_and_keys_are_checked(tmp_path: Path) -> None:
    source = events(tmp_path)
    typo = KeyedStateFunction(
        uid="typo", input=source, keys=["user"], fn=lambda i, s: (s, i), state_schema="user STRIN"
    )
    keyless = KeyedStateFunction(
        uid="keyless", input=source, keys=["user"], fn=lambda i, s: (s, i), state_schema="n LONG"
    )
    found = problems([source, typo, keyless])
    assert [(p.uid, p.field) for p in found] == [("typo", "state_schema"), ("keyless", "keys")]
    assert "its state_schema (n)" in found[1].message


def test_multi_input_operators_check_their_columns_on_each_input(tmp_path: Path) -> None:
    facts = events(tmp_path, "user STRING, amount DOUBLE", "facts")
    dims = events(tmp_path, "id STRING, version LONG, segment STRING", "dims")
    enriched = DimensionEnrichment(
        uid="enriched", facts=facts, dimension=dims, keys=["user"], version="version", columns=["segment", "tier"]
    )
    left = events(tmp_path, "user STRING, t LONG, a INT", "left")
    right = events(tmp_path, "user STRING, t2 LONG, a INT", "right")
    joined = IntervalJoin(
        uid="joined", left=left, right=right, keys=["user"], left_time="t", right_time="t", lower=0, upper=1
    )
    found = problems([facts, dims, enriched, left, right, joined])
    assert [(p.uid, p.field, p.message.split(" not among")[0]) for p in found] == [
        ("enriched", "keys", "'user'"),
        ("enriched", "columns", "'tier'"),
        ("joined", "right_time", "'t'"),
        ("joined", "inputs", "left and right both have columns ['a']"),
    ]
    assert "input dims" in found[0].message


def test_outputs_of_known_operators_carry_the_columns_downstream(tmp_path: Path) -> None:
    facts = events(tmp_path, "user STRING, amount DOUBLE", "facts")
    dims = events(tmp_path, "user STRING, version LONG, segment STRING", "dims")
    enriched = DimensionEnrichment(
        uid="enriched", facts=facts, dimension=dims, keys=["user"], version="version", columns=["segment"]
    )
    channel = Channel(uid="enriched_rows", input=enriched)
    agg = KeyedAggregate(uid="per_segment", input=channel, keys=["segment"], aggs={"revenue": "sum(amount)"})
    wrong = KeyedAggregate(uid="per_version", input=channel, keys=["version"], aggs={"n": "count"})
    assert [(p.uid, p.field) for p in problems([facts, dims, enriched, channel, agg, wrong])] == [
        ("per_version", "keys")
    ]


def test_a_union_of_inputs_with_other_columns_is_refused(tmp_path: Path) -> None:
    a = events(tmp_path, "user STRING, ts LONG", "a")
    b = events(tmp_path, "user STRING, ts BIGINT", "b")  # LONG is BIGINT
    c = events(tmp_path, "user VARCHAR(8), ts LONG", "c")  # read as a string
    d = events(tmp_path, "user STRING, ts INT", "d")
    good = Union(uid="good", inputs=[a, b, c])
    bad = Union(uid="bad", inputs=[a, d])
    found = problems([a, b, c, d, good, bad])
    assert [(p.uid, p.field) for p in found] == [("bad", "inputs")]
    assert "<user: string, ts: int>" in found[0].message


def test_kafka_source_columns_include_its_metadata_and_clashes_are_refused(tmp_path: Path) -> None:
    topic = KafkaSource(uid="topic", topics=["t"], schema="user STRING, n INT")
    agg = KeyedAggregate(uid="per_partition", input=topic, keys=["partition"], aggs={"last": "max(offset)"})
    raw = KafkaSource(uid="raw", topics=["t"], format="raw", metadata_columns=["key"])
    per_key = KeyedAggregate(uid="per_key", input=raw, keys=["key"], aggs={"n": "count(value)", "t": "max(topic)"})
    clash = KafkaSource(uid="clash", topics=["t"], schema="topic STRING")
    found = problems([topic, agg, raw, per_key, clash])
    assert [(p.uid, p.field) for p in found] == [("per_key", "aggs"), ("clash", "schema")]


def test_upsert_reading_and_delete_when_are_checked_when_defined(tmp_path: Path) -> None:
    """An upsert Kafka source gives ``tombstone``; a sink's ``delete_when`` must name an input column, in upsert
    mode, not a key; upsert reading needs the ``key`` column."""
    plans = KafkaSource(uid="plans", topics=["t"], schema="plan STRING", upsert=True)
    table = ParquetTableSink(uid="table", input=plans, path=str(tmp_path / "t"), mode="upsert", keys=["key"],
                             delete_when="tombstone")  # fmt: skip
    typo = ParquetTableSink(uid="typo", input=plans, path=str(tmp_path / "u"), mode="upsert", keys=["key"],
                            delete_when="deleted")  # fmt: skip
    forgot = DeltaTableSink(uid="forgot", input=plans, path=str(tmp_path / "d"), mode="upsert", keys=["key"])
    delta = DeltaTableSink(uid="delta", input=plans, path=str(tmp_path / "e"), mode="upsert", keys=["key"],
                           delete_when="tombstone")  # fmt: skip
    pg = PostgresTableSink(uid="pg", input=plans, conn_id="pg", table="plans", mode="upsert", keys=["key"],
                           delete_when="tombstone")  # fmt: skip
    found = problems([plans, table, typo, forgot, delta, pg])
    assert [(p.uid, p.field) for p in found] == [
        ("typo", "delete_when"),
        ("typo", "delete_when"),
        ("forgot", "delete_when"),
    ]
    assert "rows of plans with tombstone true delete their key" in found[2].message
    for bad in ({"mode": "append"}, {"mode": "upsert", "keys": ["key"], "delete_when": "key"}):
        with pytest.raises(PipelineDefinitionError, match="delete_when"):
            ParquetTableSink(uid="bad", input=plans, path=str(tmp_path / "b"), **{"delete_when": "tombstone", **bad})
        with pytest.raises(PipelineDefinitionError, match="delete_when"):
            DeltaTableSink(uid="bad", input=plans, path=str(tmp_path / "b"), **{"delete_when": "tombstone", **bad})
        with pytest.raises(PipelineDefinitionError, match="delete_when"):
            PostgresTableSink(uid="bad", input=plans, conn_id="pg", table="t", **{"delete_when": "tombstone", **bad})
    with pytest.raises(PipelineDefinitionError, match="add 'key' to metadata_columns"):
        KafkaSource(uid="keyless", topics=["t"], schema="plan STRING", upsert=True, metadata_columns=["offset"])


def test_soft_deletes_are_checked_when_defined(tmp_path: Path) -> None:
    """``deletes="soft"`` keeps the deleting column required and satisfies a source that deletes; a wrong
    ``deletes``, soft deletes without ``delete_when`` or in append mode, ``deleted_column`` naming a key or
    given without soft deletes are refused by the constructor, naming the fix."""
    plans = KafkaSource(uid="plans", topics=["t"], schema="plan STRING", upsert=True)
    soft = DeltaTableSink(uid="soft", input=plans, path=str(tmp_path / "s"), mode="upsert", keys=["key"],
                          delete_when="tombstone", deletes="soft")  # fmt: skip
    typo = PostgresTableSink(uid="typo", input=plans, conn_id="pg", table="t", mode="upsert", keys=["key"],
                             delete_when="deleted", deletes="soft", deleted_column="deleted")  # fmt: skip
    assert soft.soft_delete is not None and soft.soft_delete.column == "__deleted" and soft.delete_when is None
    clash = ParquetTableSink(uid="clash", input=plans, path=str(tmp_path / "c"), mode="upsert", keys=["key"],
                             delete_when="tombstone", deletes="soft", deleted_column="plan")  # fmt: skip
    found = problems([plans, soft, typo, clash])
    assert [(p.uid, p.field) for p in found] == [
        ("typo", "delete_when"),
        ("typo", "delete_when"),
        ("clash", "deleted_column"),
    ]
    assert "'plan' is already a column of plans; soft deletes add it" in found[2].message
    upsert = {"mode": "upsert", "keys": ["key"]}
    refused = [
        ({**upsert, "delete_when": "tombstone", "deletes": "logical"}, "deletes must be 'hard' or 'soft'"),
        ({**upsert, "deletes": "soft"}, "deletes='soft' needs mode='upsert' and delete_when"),
        ({"mode": "append", "deletes": "soft"}, "deletes='soft' needs mode='upsert' and delete_when"),
        ({**upsert, "delete_when": "tombstone", "deleted_column": "gone"}, "deleted_column applies to soft deletes"),
        ({**upsert, "delete_when": "tombstone", "deletes": "soft", "deleted_column": "key"}, "not a key"),
    ]
    tables: list[dict[str, Any]] = [{"path": str(tmp_path / "b")}, {"conn_id": "pg", "table": "t"}]
    for options, message in refused:
        for sink, table in [(ParquetTableSink, tables[0]), (DeltaTableSink, tables[0]), (PostgresTableSink, tables[1])]:
            with pytest.raises(PipelineDefinitionError, match=message):
                sink(uid="bad", input=plans, **table, **options)


def test_a_sink_writing_where_a_source_reads_is_a_feedback_loop(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    source = FileSource(uid="files", path=str(landing), format="json", schema=SCHEMA)
    parquet = FileSource(uid="only_json", path=str(tmp_path / "other"), format="json", schema=SCHEMA, pattern="*.json")
    delta = DeltaSource(uid="lake", path=str(tmp_path / "lake"))
    inside = ParquetTableSink(uid="inside", input=source, path=str(landing / "out"))
    hidden = ParquetTableSink(uid="hidden", input=source, path=str(landing / "_out"))
    unmatched = ParquetTableSink(uid="unmatched", input=parquet, path=str(tmp_path / "other" / "out"))
    same = DeltaTableSink(uid="same", input=delta, path=f"{tmp_path}/lake/")
    found = problems([source, parquet, delta, inside, hidden, unmatched, same])
    assert [(p.uid, p.field) for p in found] == [("inside", "target"), ("same", "target")]
    assert "lies where source files reads" in found[0].message


def test_a_dead_letter_table_shares_the_rules(tmp_path: Path) -> None:
    with collecting() as nodes:
        source = FileSource(
            uid="files",
            path=str(tmp_path / "landing"),
            format="json",
            schema=SCHEMA,
            on_malformed="dead_letter",
            dead_letter_path=str(tmp_path / "out"),
        )
        ParquetTableSink(uid="out", input=source, path=str(tmp_path / "out"))
    with pytest.raises(PipelineDefinitionError, match=r"files\.dead_letters: target: .* written by sink out too"):
        PipelineGraph(nodes)


def test_a_valid_pipeline_has_no_problem(tmp_path: Path) -> None:
    source = events(tmp_path)
    agg = KeyedAggregate(uid="per_user", input=source, keys=["user"], aggs={"n": "count", "last": "max(ts)"})
    hold = DimensionEnrichment(
        uid="held",
        facts=events(tmp_path, "user STRING, amount DOUBLE", "facts"),
        dimension=events(tmp_path, "user STRING, version LONG, segment STRING", "dims"),
        keys=["user"],
        version="version",
        columns=["segment"],
        on_missing="hold",
        hold_ttl=datetime.timedelta(hours=1),
    )
    sinks = [
        ParquetTableSink(uid="out", input=agg, path=str(tmp_path / "out"), mode="upsert", keys=["user"]),
        DeltaTableSink(uid="held_out", input=hold, path=str(tmp_path / "held"), partition_by=["segment"]),
    ]
    assert problems([source, agg, *hold.inputs, hold, *sinks]) == []


def test_a_dead_letter_path_in_the_landing_directory_is_a_feedback_loop(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    with collecting() as nodes:
        source = FileSource(
            uid="files",
            path=str(landing),
            format="json",
            schema=SCHEMA,
            on_malformed="dead_letter",
            dead_letter_path=str(landing / "dead"),
        )
        ParquetTableSink(uid="out", input=source, path=str(tmp_path / "out"))
    with pytest.raises(PipelineDefinitionError, match=r"files\.dead_letters: target: .* lies where source files reads"):
        PipelineGraph(nodes)


def test_a_pipeline_s_dag_is_refused_when_it_is_built(tmp_path: Path) -> None:
    from airflow_provider_checkpoint import CheckpointedPipeline

    refused = pytest.raises(PipelineDefinitionError, match=r"per_user: keys: 'usr' not among")
    with refused, CheckpointedPipeline(dag_id="refused", storage=f"file://{tmp_path}/checkpoints"):
        source = events(tmp_path)
        agg = KeyedAggregate(uid="per_user", input=source, keys=["usr"], aggs={"n": "count"})
        ParquetTableSink(uid="out", input=agg, path=str(tmp_path / "out"), mode="upsert", keys=["usr"])


def test_nodes_in_any_order_are_followed_from_their_inputs(tmp_path: Path) -> None:
    source = events(tmp_path)
    agg = KeyedAggregate(uid="per_user", input=source, keys=["user"], aggs={"n": "count"})
    sink = ParquetTableSink(uid="out", input=agg, path=str(tmp_path / "out"), mode="upsert", keys=["usr"])
    assert [(p.uid, p.field) for p in problems([sink, agg, source])] == [("out", "keys")]


def test_a_source_on_a_filesystem_this_machine_lacks_is_no_error(tmp_path: Path) -> None:
    remote = FileSource(uid="remote", path="nosuchfs://bucket/landing", format="json", schema=SCHEMA)
    sink = ParquetTableSink(uid="out", input=remote, path=str(tmp_path / "out"))
    assert problems([remote, sink]) == []
