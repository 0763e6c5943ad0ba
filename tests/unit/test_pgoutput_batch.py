"""The vectorized TupleData parse (:func:`.pgoutput_batch.tuple_columns`) against the per-message decoder
(:func:`.pgoutput.tuple_values`) on random change messages: random widths, nulls, unchanged TOASTed values,
texts (empty, multi-byte UTF-8, bytes that are not UTF-8), and messages cut short, lengthened, with a
wrong value count or a length past their end, with other messages around and between them. Either both give
the same values, or the batch is ``None`` and some message does not decode alone into ``width`` text-or-null
values ending where it does."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_checkpoint.connectors.postgres.pgoutput import DECODE_ERRORS, UNCHANGED, tuple_values
from airflow_provider_checkpoint.connectors.postgres.pgoutput_batch import Messages, tuple_columns
from tests.unit.test_pgoutput import tuple_data

OID = struct.pack(">I", 16384)
HEADS = [b"I" + OID + b"N", b"U" + OID + b"N", b"D" + OID + b"K"]

texts = st.one_of(
    st.text(max_size=6).map(str.encode),  # empty, multi-byte UTF-8 (surrogates are not encodable: left out)
    st.binary(max_size=6),  # mostly not UTF-8
    st.sampled_from([b"\xed\xa0\x80", b"\xc0\x80", b"\xf4\x90\x80\x80", "é".encode()[:1]]),  # near misses
)
items = st.one_of(st.just(b"n"), st.just(b"u"), texts.map(lambda t: b"t" + struct.pack(">i", len(t)) + t))


@st.composite
def messages(draw: Any, width: int) -> bytes:
    values = draw(st.lists(items, min_size=width, max_size=width))
    count = width if draw(st.integers(0, 9)) else draw(st.sampled_from([width - 1, width + 1]))
    message = draw(st.sampled_from(HEADS)) + struct.pack(">h", count) + b"".join(values)
    broken = draw(st.integers(0, 19))
    if broken == 0:  # cut short
        message = message[: draw(st.integers(0, len(message)))]
    elif broken == 1:  # bytes after its tuple
        message += draw(st.binary(min_size=1, max_size=3))
    elif broken == 2 and b"t" in message[8:]:  # a length past the end, or negative
        at = message.index(b"t", 8)
        message = message[: at + 1] + struct.pack(">i", draw(st.sampled_from([-1, 1 << 20]))) + message[at + 5 :]
    return message


def model(batch: list[bytes], width: int) -> list[list[Any]] | None:
    columns: list[list[Any]] = [[] for _ in range(width)]
    for message in batch:
        try:
            values, end = tuple_values(message, 6)
        except DECODE_ERRORS:
            return None
        if len(values) != width or end != len(message) or UNCHANGED in values:
            return None
        for column, value in zip(columns, values, strict=True):
            column.append(value)
    return columns


@settings(max_examples=100)
@given(st.integers(1, 5).flatmap(lambda w: st.tuples(st.just(w), st.lists(messages(w), max_size=8))), st.data())
def test_the_batch_parse_equals_the_per_message_decoder(case, data):
    width, batch = case
    stream, index = [], []  # messages around and between the batch's, not in it
    for message in batch:
        stream += data.draw(st.lists(st.binary(max_size=12), max_size=2))
        index.append(len(stream))
        stream.append(message)
    stream += data.draw(st.lists(st.binary(max_size=12), max_size=2))
    got = tuple_columns(Messages.of(stream), np.array(index, np.int64), width)
    want = model(batch, width)
    if want is None or got is None:
        assert got is None and want is None
    else:
        assert [a.to_pylist() for a in got] == want


def test_a_batch_that_does_not_parse_is_none():
    batch = [b"I" + OID + b"N" + tuple_data(1, "é", None), b"D" + OID + b"K" + tuple_data(22, None, "")]
    parse = lambda ms, width=3: tuple_columns(Messages.of(ms), np.arange(len(ms)), width)  # noqa: E731
    got = parse(batch)
    assert got is not None and [a.to_pylist() for a in got] == [["1", "22"], ["é", None], [None, ""]]
    assert parse(batch, 2) is None  # not the relation's width
    for index in ([1, 0], [0, 0]):  # not ascending: the texts are cut out of the buffer in its order
        assert tuple_columns(Messages.of(batch), np.array(index), 3) is None
    assert parse([*batch, b"U" + OID + b"N" + tuple_data(3, UNCHANGED, "x")]) is None
    assert parse([batch[0] + b"\0"]) is None  # bytes after its tuple
    assert parse([batch[0][:-1]]) is None  # ends before its last value
    cut = b"I" + OID + b"N" + tuple_data(1, None, "abc")
    assert parse([cut[:-1], cut]) is None  # ends inside a value
    assert parse([cut, cut[:-1]]) is None  # the last ends inside a value
    long = b"I" + OID + b"N" + struct.pack(">h", 3) + b"nnt" + struct.pack(">i", 1000) + b"ab"
    assert parse([cut, long]) is None  # a length past the end of every message


def test_messages_split_where_their_sizes_say():
    buffer = Messages.of([b"B12", b"", b"I" + OID + b"N"])
    assert [buffer.message(i) for i in range(3)] == [b"B12", b"", b"I" + OID + b"N"]
    assert buffer.kinds.tolist() == [ord("B"), 0, ord("I")]
    assert buffer.simple.tolist() == [False, False, True]
    assert buffer.oids.tolist()[2] == 16384
