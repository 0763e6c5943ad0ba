"""The chunked snapshot's pure parts: a snapshot's visibility of pgoutput's 32-bit transaction ids (across an
epoch), the validation of the cursor and chunk a position records, the option, and an update that moves a
row to another primary key (a delete of the old key, then the update)."""

from __future__ import annotations

import struct

import pytest

from airflow_provider_checkpoint.connectors.postgres.cdc import PostgresCdcSource
from airflow_provider_checkpoint.connectors.postgres.cdc_chunks import (
    Cursor,
    Snapshot,
    chunk_dir,
    parse_chunk,
    parse_cursor,
)
from airflow_provider_checkpoint.connectors.postgres.cdc_types import TableColumn
from airflow_provider_checkpoint.connectors.postgres.pgoutput_columns import decode_rows
from airflow_provider_checkpoint.exceptions import InvalidPositionError, PipelineDefinitionError
from tests.unit.test_pgoutput import begin, commit, s, tuple_data

EPOCH = 3 << 32


def test_a_snapshot_sees_what_committed_before_it_and_not_what_ran():
    snapshot = Snapshot.parse(f"{EPOCH + 100}:{EPOCH + 110}:{EPOCH + 102},{EPOCH + 105}")
    assert Snapshot.parse(snapshot.text()) == snapshot
    seen = {x: snapshot.sees(x) for x in (99, 100, 101, 102, 105, 109, 110, 120)}
    assert seen == {99: True, 100: True, 101: True, 102: False, 105: False, 109: True, 110: False, 120: False}


def test_visibility_holds_across_a_32_bit_wraparound():
    xmax = EPOCH + 5  # ids 2^32 - 3 … 2^32 - 1 of the previous epoch, 3 and 4 of this one
    snapshot = Snapshot.parse(f"{EPOCH - 3}:{xmax}:{EPOCH - 2},{EPOCH + 3}")
    assert snapshot.sees((1 << 32) - 4) and snapshot.sees((1 << 32) - 1) and snapshot.sees(4)
    assert not snapshot.sees((1 << 32) - 2) and not snapshot.sees(3) and not snapshot.sees(5)


@pytest.mark.parametrize("text", ["", "1:2", "5:3:", "0:0:", "3:9:1", "3:9:x", "3:9:9"])
def test_a_snapshot_that_is_not_one_is_refused(text):
    with pytest.raises(ValueError):
        Snapshot.parse(text)


def test_cursors_and_chunks_read_back_are_validated():
    tables = ["public.a", "public.b"]
    assert parse_cursor("s", None, tables) is None
    assert parse_cursor("s", {"table": "public.b", "after": ["1", "x"]}, tables) == Cursor("public.b", ["1", "x"])
    for bad in (
        {"table": "public.c", "after": None},
        {"table": "public.a", "after": []},
        {"table": "public.a", "after": [1]},
        {"table": "public.a"},
        {"table": "public.a", "after": None, "more": 1},
        ["public.a"],
    ):
        with pytest.raises(InvalidPositionError, match="snapshot_cursor"):
            parse_cursor("s", bad, tables)
    good = {"file": f"{chunk_dir('s')}/{'0' * 32}.parquet", "snapshot": "5:9:7", "rows": 3}
    assert parse_chunk("s", good).to_json() == good
    for change in (
        {"file": f"{chunk_dir('s')}/../../chk-1/_metadata"},
        {"file": f"{chunk_dir('other')}/{'0' * 32}.parquet"},
        {"file": f"/{chunk_dir('s')}/{'0' * 32}.parquet"},
        {"snapshot": "9:5:"},
        {"rows": -1},
        {"rows": True},
    ):
        with pytest.raises(InvalidPositionError, match="is not a snapshot chunk"):
            parse_chunk("s", {**good, **change})


@pytest.mark.parametrize("rows", [0, -1, True, 2.5, "10"])
def test_snapshot_chunk_rows_must_be_a_positive_int(rows):
    with pytest.raises(PipelineDefinitionError, match="snapshot_chunk_rows must be a positive int"):
        PostgresCdcSource("s", ["t"], snapshot_chunk_rows=rows)


def _relation(identity: str, key: tuple[bool, ...]) -> bytes:
    body = struct.pack(">I", 1) + s("public") + s("t") + identity.encode() + struct.pack(">h", 3)
    for name, flag in zip("abv", key, strict=True):
        body += struct.pack(">b", int(flag)) + s(name) + struct.pack(">Ii", 23, -1)
    return b"R" + body


CATALOG = {"public.t": {n: TableColumn("public.t", n, 23, -1, "integer", n in "ab") for n in "abv"}}


@pytest.mark.parametrize(
    ("identity", "flags", "old", "new", "rows"),
    [
        (
            "d",
            (True, True, False),
            ("1", "2", None),
            ("1", "3", "9"),
            [("delete", "1", "2", None), ("update", "1", "3", "9")],
        ),
        ("f", (True, True, True), ("1", "2", "8"), ("1", "2", "9"), [("update", "1", "2", "9")]),
        (
            "f",
            (True, True, True),
            ("1", "2", "8"),
            ("4", "2", "9"),
            [("delete", "1", "2", "8"), ("update", "4", "2", "9")],
        ),
    ],
)
def test_an_update_that_moves_a_row_to_another_key_deletes_the_old_key_first(identity, flags, old, new, rows):
    marker = b"O" if identity == "f" else b"K"
    update = b"U" + struct.pack(">I", 1) + marker + tuple_data(*old) + b"N" + tuple_data(*new)
    messages = [_relation(identity, flags), begin(100, 7), update, commit(100, 101)]
    (table,) = decode_rows("s", "slot", messages, list(CATALOG["public.t"].values()), CATALOG, (0, 1000))
    got = [(r["op"], r["a"], r["b"], r["v"]) for r in table.to_pylist()]
    assert got == [tuple(None if v is None else int(v) if v.isdigit() else v for v in row) for row in rows]
