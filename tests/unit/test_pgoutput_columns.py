"""The one-pass decoder (pgoutput messages into Arrow columns) against the decoder into ``Transaction``s and
``change_rows`` as its model: random streams of transactions (inserts, updates, key changes, deletes, nulls,
unchanged TOASTed values with and without the old row, TRUNCATE, two tables, a column added and one dropped
mid-stream, open transactions at the end), random spans and snapshot groups; both give equal Arrow tables or
both refuse."""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_checkpoint.connectors.postgres.cdc_rows import arrow
from airflow_provider_checkpoint.connectors.postgres.cdc_types import TableColumn
from airflow_provider_checkpoint.connectors.postgres.pgoutput import UNCHANGED, Decoder
from airflow_provider_checkpoint.connectors.postgres.pgoutput_columns import decode_rows
from airflow_provider_checkpoint.exceptions import CdcSourceError
from tests.unit.cdc_model import change_rows
from tests.unit.test_pgoutput import begin, commit, s, tuple_data

TABLES = {16384: "t1", 16385: "t2"}
TYPES = {"id": 20, "a": 25, "b": 25, "c": 701, "gone": 25}


def catalog_columns(table: str) -> list[TableColumn]:
    q = f"public.{table}"
    return [
        TableColumn(q, "id", 20, -1, "bigint", True),
        TableColumn(q, "a", 25, -1, "text", False),
        TableColumn(q, "b", 25, -1, "text", False),
        TableColumn(q, "c", 701, -1, "double precision", False),
    ]


CATALOG = {f"public.{t}": {c.name: c for c in catalog_columns(t)} for t in TABLES.values()}
COLUMNS = catalog_columns("t1")


def relation(oid: int, names: list[str], identity: bytes) -> bytes:
    body = struct.pack(">I", oid) + s("public") + s(TABLES[oid]) + identity + struct.pack(">h", len(names))
    for name in names:
        body += struct.pack(">b", int(name == "id")) + s(name) + struct.pack(">Ii", TYPES[name], -1)
    return b"R" + body


value = st.one_of(st.none(), st.text("xyé", max_size=3))


def row(draw: Any, names: list[str], key: int, unchanged: bool = False) -> bytes:
    """A tuple of key ``key`` and random values of the other columns (some unchanged TOASTed ones)."""
    rest = [draw(value) for _ in names[1:]]
    if unchanged:
        rest = [UNCHANGED if draw(st.booleans()) else v for v in rest]
    rest = [
        str(draw(st.floats(-9, 9, allow_nan=False))) if n == "c" and v else v
        for n, v in zip(names[1:], rest, strict=True)
    ]
    return tuple_data(key, *rest)


@st.composite
def streams(draw: Any) -> tuple[list[bytes], list[int], list[int]]:
    """Messages, the transactions' commit LSNs and ids."""
    messages: list[bytes] = []
    shapes = {oid: ["id", "a", "b"] for oid in TABLES}
    identity = {oid: draw(st.sampled_from([b"d", b"f", b"i"])) for oid in TABLES}
    for oid in TABLES:
        messages.append(relation(oid, shapes[oid], identity[oid]))
    lsns, xids = [], []
    for t in range(draw(st.integers(1, 6))):
        lsn, xid = 0x100 * (t + 1), draw(st.integers(1, 6))
        messages.append(begin(lsn, xid, ts=t))
        for _ in range(draw(st.integers(0, 6))):
            oid = draw(st.sampled_from(sorted(TABLES)))
            kind = draw(st.sampled_from(["I", "U", "UK", "UO", "DK", "DO", "R", "T"]))
            o = struct.pack(">I", oid)
            names = shapes[oid]

            key = draw(st.integers(0, 5))
            if kind == "I":
                messages.append(b"I" + o + b"N" + row(draw, names, key))
            elif kind == "U":
                messages.append(b"U" + o + b"N" + row(draw, names, key, unchanged=draw(st.integers(0, 9)) == 0))
            elif kind == "UK":
                messages.append(
                    b"U"
                    + o
                    + b"K"
                    + tuple_data(key, *[None] * (len(names) - 1))
                    + b"N"
                    + row(draw, names, draw(st.integers(0, 5)))
                )
            elif kind == "UO":
                messages.append(
                    b"U"
                    + o
                    + b"O"
                    + row(draw, names, key)
                    + b"N"
                    + row(draw, names, draw(st.integers(0, 5)), unchanged=True)
                )
            elif kind == "DK":
                messages.append(b"D" + o + b"K" + tuple_data(key, *[None] * (len(names) - 1)))
            elif kind == "DO":
                messages.append(b"D" + o + b"O" + row(draw, names, key))
            elif kind == "R":  # a column added, or one the catalog no longer has (dropped)
                extra = draw(st.sampled_from(["c", "gone"]))
                shapes[oid] = names = [n for n in names if n != extra] if extra in names else [*names, extra]
                messages.append(relation(oid, names, identity[oid]))
            elif draw(st.integers(0, 3)) == 0:
                messages.append(b"T" + struct.pack(">ibI", 1, 0, oid))
        if t < 5 or draw(st.booleans()):  # the last may stay open
            messages.append(commit(lsn, lsn + 0x10))
        lsns.append(lsn)
        xids.append(xid)
    return messages, lsns, xids


def model(messages: list[bytes], span: tuple[int, int], seen: Any) -> list[pa.Table]:
    start, end = span
    txns = [t for t in Decoder("slot", since=start).transactions(messages) if start <= t.commit_lsn < end]
    groups: list[Iterable[Any]] = (
        [txns] if seen is None else [[t for t in txns if seen(t.xid)], [t for t in txns if not seen(t.xid)]]
    )
    return [arrow(COLUMNS, change_rows("src", CATALOG, g)) for g in groups]


def outcome(f: Any) -> Any:
    try:
        return f()
    except CdcSourceError:
        return CdcSourceError


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(streams(), st.integers(0, 3), st.integers(2, 8), st.one_of(st.none(), st.frozensets(st.integers(1, 6))))
def test_one_pass_rows_equal_the_transactions_rows(stream, a, b, visible):
    messages, _, _ = stream
    span = (0x100 * min(a, b), 0x100 * max(a, b) + 1)
    seen = None if visible is None else visible.__contains__
    want = outcome(lambda: model(messages, span, seen))
    got = outcome(lambda: decode_rows("src", "slot", messages, COLUMNS, CATALOG, span, seen))
    if want is CdcSourceError or got is CdcSourceError:
        assert got is want
    else:
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g.equals(w), (g.to_pylist(), w.to_pylist())


def test_a_transaction_without_its_commit_gives_no_row():
    o = struct.pack(">I", 16384)
    messages = [relation(16384, ["id", "a", "b"], b"d"), begin(0x100, 1), b"I" + o + b"N" + tuple_data(1, "x", None)]
    (table,) = decode_rows("src", "slot", messages, COLUMNS, CATALOG, (0, 0x1000))
    assert table.num_rows == 0
    (table,) = decode_rows("src", "slot", [*messages, commit(0x100, 0x110)], COLUMNS, CATALOG, (0, 0x1000))
    assert table.to_pylist()[0]["id"] == 1 and table.to_pylist()[0]["op"] == "insert"


def test_a_change_of_a_table_not_in_the_catalog_is_refused():
    o = struct.pack(">I", 16384)
    messages = [relation(16384, ["id"], b"d"), begin(0x100, 1), b"I" + o + b"N" + tuple_data(1), commit(0x100, 0x110)]
    with pytest.raises(CdcSourceError, match="not among the source's tables"):
        decode_rows("src", "slot", messages, COLUMNS, {}, (0, 0x1000))
