"""The upsert rule on the driver (:func:`latest_in_arrow`), and its shortcut for one integer key proven unique
by a sort (:func:`unique_integer_key`), against a plain-Python model of the rule over random rows."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_checkpoint.connectors.base.upsert_rule import latest_in_arrow, unique_integer_key

INTEGERS = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint64()]


def _model(keys: list[Any], seqs: list[int | None] | None) -> set[tuple[Any, int]]:
    """Per key (a null is a value) the row of the greatest ``seq`` (a null lowest), ties → the later row; without
    ``seqs`` the later row. Rows as (key, position)."""
    best: dict[Any, tuple[tuple[bool, int, int], int]] = {}
    for position, key in enumerate(keys):
        seq = None if seqs is None else seqs[position]
        rank = (seq is not None, seq or 0, position)
        if key not in best or rank > best[key][0]:
            best[key] = (rank, position)
    return {(key, position) for key, (_, position) in best.items()}


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    kind=st.sampled_from(INTEGERS),
    sequence_by=st.booleans(),
    chunks=st.integers(1, 3),
)
def test_one_integer_key_reduces_as_the_rule_says(
    data: st.DataObject, kind: pa.DataType, sequence_by: bool, chunks: int
) -> None:
    unsigned = pa.types.is_unsigned_integer(kind)
    extremes = [2**kind.bit_width - 1] if unsigned else [-(2 ** (kind.bit_width - 1)), 2 ** (kind.bit_width - 1) - 1]
    spread = st.integers(0 if unsigned else -10, 10) | st.sampled_from(extremes)
    keys = data.draw(st.lists(st.none() | spread, max_size=40))
    if data.draw(st.booleans()):  # often no key twice: the shortcut's case
        keys = list(dict.fromkeys(keys))
    seqs = data.draw(st.lists(st.none() | st.integers(0, 3), min_size=len(keys), max_size=len(keys)))
    size = -(-len(keys) // chunks) or 1
    column = pa.chunked_array([pa.array(keys[i : i + size], kind) for i in range(0, len(keys), size)], kind)
    rows = pa.table({"k": column, "pos": list(range(len(keys))), "seq": pa.array(seqs, pa.int64())})

    assert unique_integer_key(rows, ["k"]) == (len(set(keys)) == len(keys))
    got = latest_in_arrow(rows, ["k"], ["seq", "pos"] if sequence_by else [])
    assert set(zip(got["k"].to_pylist(), got["pos"].to_pylist(), strict=True)) == _model(
        keys, seqs if sequence_by else None
    )
    assert got.num_rows == len(set(keys)), "one row per key"


def test_other_keys_are_not_taken_for_unique() -> None:
    """Two key columns, a string key, a float key: grouped by pyarrow, never declared unique by the sort."""
    rows = pa.table({"a": [1, 2], "b": ["x", "y"], "f": [1.0, 2.0]})
    assert not unique_integer_key(rows, ["a", "b"])
    assert not unique_integer_key(rows, ["b"])
    assert not unique_integer_key(rows, ["f"])
    assert unique_integer_key(rows, ["a"])
    assert unique_integer_key(rows.slice(0, 0), ["a"])
