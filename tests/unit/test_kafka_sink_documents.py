"""KafkaSink's untrusted inputs, without a broker: its committables, the published marker, its parameters.

A Hypothesis model checks the marker against the commit history it stands for: after any sequence of
checkpoints published in id order (ids possibly reused by a job that lost its storage, with new
tokens), a checkpoint counts as published exactly when it was."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_checkpoint.connectors.kafka.publish import HISTORY, Marker
from airflow_provider_checkpoint.connectors.kafka.sink import KafkaSink
from airflow_provider_checkpoint.dataflow.graph import Node
from airflow_provider_checkpoint.exceptions import DocumentError, PipelineDefinitionError, SinkConnectionError

TOKEN = "0123456789abcdef" * 2
GOOD = {
    "checkpoint_id": 4,
    "file": "chk-4/step_out/attempt-2/kafka-out.parquet",
    "records": 7,
    "checksum": "sha256:" + "a" * 64,
    "token": TOKEN,
}


def sink(**kwargs: object) -> KafkaSink:
    return KafkaSink("out", Node("in", []), "events", **kwargs)  # type: ignore[arg-type]


def test_the_committable_stage_writes_is_accepted():
    assert sink().read_committable(4, [GOOD], "doc") == GOOD


@pytest.mark.parametrize(
    "change, field",
    [
        ({"file": "chk-3/step_out/attempt-2/kafka-out.parquet"}, "file"),  # another checkpoint's
        ({"file": "chk-4/step_out/attempt-2/../../../etc/passwd"}, "file"),
        ({"file": "chk-4/step_out/attempt-2/kafka-other.parquet"}, "file"),  # another sink's
        ({"file": "/tmp/kafka-out.parquet"}, "file"),
        ({"checkpoint_id": 5}, "checkpoint_id"),
        ({"records": -1}, "records"),
        ({"checksum": "md5:abc"}, "checksum"),
        ({"token": "ZZ"}, "token"),
        ({"extra": 1}, "must have exactly"),
    ],
)
def test_a_forged_committable_is_refused_naming_the_field(change, field):
    with pytest.raises(DocumentError, match=field):
        sink().read_committable(4, [{**GOOD, **change}], "doc")


def test_committables_that_are_not_one_object_are_refused():
    for bad in ([], [GOOD, GOOD], GOOD, None):
        with pytest.raises(DocumentError):
            sink().read_committable(4, bad, "doc")


@pytest.mark.parametrize(
    "metadata",
    [
        f'{{"published": [[0, "{TOKEN}"]]}}',
        '{"published": [[1, "x"]]}',
        "[]",
        "{",
        f'{{"published": [[true, "{TOKEN}"]]}}',
    ],
)
def test_a_marker_we_did_not_write_is_refused(metadata):
    with pytest.raises(SinkConnectionError, match="not a published marker"):
        Marker.parse(metadata, "group g")


def test_parameters_are_checked_when_the_pipeline_is_declared():
    for bad in (
        {"format": "avro"},
        {"format": "raw", "tombstone_column": "gone"},
        {"transactional_id_prefix": "bad id"},
        {"transaction_timeout_ms": 10},
    ):
        with pytest.raises(PipelineDefinitionError):
            sink(**bad)
    with pytest.raises(PipelineDefinitionError):
        KafkaSink("out", Node("in", []), "no topic!")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 3 * HISTORY), st.booleans(), st.integers(0, 4 * HISTORY)), max_size=6),
)
def test_the_marker_says_published_exactly_for_what_was(runs):
    """``runs``: jobs publishing checkpoints ``1, 2, ...`` in id order, one token each (staged later than all
    before); a job that lost its storage counts from 1 again; after each run a restore to ``n - back`` commits
    that older checkpoint again. The marker, round-tripped through its metadata before every commit, must
    say "not published" for every new checkpoint (else its records are lost) and "published" for every
    restored one (else they are doubled)."""
    marker, n, clock, token_of = Marker(), 0, 0, {}
    for count, lost_storage, back in runs:
        if lost_storage:
            n, token_of = 0, {}
        for _ in range(count):
            n, clock = n + 1, clock + 1
            token = f"{clock:016x}{n:016x}"
            assert not marker.published(n, token), f"new checkpoint {n} taken as published: lost"
            marker = Marker.parse(marker.add(n, token).metadata(), "g")
            token_of[n] = token
        if n:
            restored = max(1, n - back)
            assert marker.published(restored, token_of[restored]), f"restored {restored} published again: doubled"


def test_a_new_checkpoint_staged_by_a_lagging_clock_is_not_taken_as_published():
    """A full list of checkpoints 10..41; checkpoint 42 staged on a worker whose clock is behind all of
    them is new by its id: it must be published (taking it for an old one would lose its records)."""
    marker = Marker(tuple((i, f"{1000 + i:016x}{i:016x}") for i in range(10, 10 + HISTORY)))
    assert not marker.published(10 + HISTORY, f"{500:016x}{42:016x}")
    assert marker.published(9, f"{500:016x}{9:016x}")  # older by id and by time: a restored one


def test_a_record_larger_than_the_topic_or_producer_allows_is_refused_in_the_step():
    import pyarrow as pa

    from airflow_provider_checkpoint.connectors.kafka.sink import staged_schema
    from airflow_provider_checkpoint.connectors.kafka.sizes import RECORD_FRAMING, check_sizes, record_sizes
    from airflow_provider_checkpoint.exceptions import SinkSchemaError

    rows = pa.Table.from_pylist(
        [
            {"key": b"k", "value": b"x" * 10, "headers": [{"key": "h", "value": b"vv"}, {"key": "ab", "value": None}]},
            {"key": None, "value": None, "headers": None, "partition": None},
            {"key": b"key", "value": b"y" * 900, "headers": [], "partition": 1},
        ],
        schema=staged_schema(),
    )
    framing = RECORD_FRAMING
    assert record_sizes(rows).tolist() == [1 + 10 + 3 + 2 + framing, framing, 3 + 900 + framing]
    check_sizes("out", "t", rows, 903 + framing, {}, "kafka_default")  # at the limit: accepted
    with pytest.raises(SinkSchemaError, match=r"1 record\(s\) .* larger than 1,002 bytes, the largest 1,003"):
        check_sizes("out", "t", rows, 1_002, {}, "kafka_default")  # the topic's limit
    with pytest.raises(
        SinkSchemaError, match=r"topic t's max.message.bytes \(not readable\) .*message.max.bytes \(500"
    ):
        check_sizes("out", "t", rows, None, {"message.max.bytes": "500"}, "kafka_default")  # the producer's


def test_a_source_feeding_only_the_sink_is_read_in_one_pass(tmp_path):
    """The staging's one Spark job reads the input once: its only source is read uncached, counted on that pass;
    a second consumer of the source takes that away."""
    from airflow_provider_checkpoint.connectors.files.parquet_sink import ParquetTableSink
    from airflow_provider_checkpoint.connectors.files.source import FileSource
    from airflow_provider_checkpoint.dataflow.planner import PipelineGraph
    from airflow_provider_checkpoint.spark.step_reads import _only_consumers, _read_once

    src = FileSource("events", str(tmp_path / "landing"), "json", "user STRING")
    out = KafkaSink("out", src, "events", step="s")
    (step,) = PipelineGraph([src, out]).steps
    assert _read_once(_only_consumers(PipelineGraph([src, out]), step)) == {"events": "out"}
    table = ParquetTableSink("table", src, str(tmp_path / "t"), step="s")
    assert _read_once(_only_consumers(PipelineGraph([src, out, table]), step)) == {}
