"""The Delta column types of flat schemas, mapped without delta-rs, against delta-rs's own mapping."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from deltalake.schema import Schema
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_checkpoint.connectors.delta.columns import arrow_columns, json_columns

TYPES = [
    pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.float32(), pa.float64(), pa.bool_(), pa.string(),
    pa.large_string(), pa.binary(), pa.large_binary(), pa.date32(), pa.timestamp("us", "UTC"), pa.timestamp("us"),
    pa.uint8(), pa.uint64(), pa.date64(), pa.timestamp("ms"), pa.timestamp("ns", "UTC"), pa.string_view(),
    pa.list_(pa.int64()), pa.struct([("a", pa.int32())]), pa.map_(pa.string(), pa.int64()),
]  # fmt: skip
ARROW = st.one_of(
    st.sampled_from(TYPES),
    st.integers(1, 38).flatmap(lambda p: st.integers(0, p).map(lambda s: pa.decimal128(p, s))),
)
NAMES = st.text("abcXY_é1", min_size=1, max_size=4)


def _delta_rs(schema: pa.Schema) -> dict[str, str]:
    return {f.name: f.type.to_json().strip('"') for f in Schema.from_arrow(schema).fields}


@settings(max_examples=200, deadline=None)
@given(fields=st.lists(st.tuples(NAMES, ARROW), max_size=6))
def test_flat_columns_are_typed_as_delta_rs_types_them_or_left_to_it(fields: list[tuple[str, pa.DataType]]) -> None:
    schema = pa.schema(fields) if len({n for n, _ in fields}) == len(fields) else None
    if schema is None:
        assert arrow_columns(pa.schema([pa.field(n, t) for n, t in fields])) is None  # a name twice
        return
    ours = arrow_columns(schema)
    nested = any(pa.types.is_nested(t) for _, t in fields)
    if ours is None:
        assert nested or any(t not in TYPES[:14] and not pa.types.is_decimal(t) for _, t in fields)
        return
    assert ours == _delta_rs(schema)
    text = Schema.from_arrow(schema).to_json()  # the schemaString a table's log holds
    assert json_columns(text) == ours
    assert not nested


@pytest.mark.parametrize(
    "field",
    [
        {"name": "a", "type": {"type": "array", "elementType": "long", "containsNull": True}},
        {"name": "a", "type": "decimal(39,1)"},
        {"name": "a", "type": "decimal(3,4)"},
        {"name": "a", "type": "decimal(12, 2)"},
        {"name": "a", "type": "varchar"},
        {"name": "a", "type": "long", "nullable": "yes"},
        {"name": "a", "type": "long", "other": 1},
        {"name": 1, "type": "long"},
    ],
)
def test_a_schema_string_with_anything_else_is_left_to_delta_rs(field: dict[str, object]) -> None:
    assert json_columns(json.dumps({"type": "struct", "fields": [field]})) is None
    assert json_columns(json.dumps({"type": "struct", "fields": [{"name": "a", "type": "long"}] * 2})) is None
    assert json_columns("not json") is None
