"""An input lacking a column of its table (``schema_evolution="additive"``), without Spark: which columns are
written null, in what order; which files of an upsert table may hold a value in them (footer statistics of
files pyarrow writes) and the rows read from those; the refusals (NOT NULL; Delta's column mapping, defaults
and generated columns)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.types import LongType, StringType, StructField, StructType

from airflow_provider_checkpoint.connectors.base.file_threads import each_file
from airflow_provider_checkpoint.connectors.base.missing_columns import (
    TableFile,
    check_held_once,
    filled_arrow,
    held_values,
    may_hold_values,
    missing_fields,
)
from airflow_provider_checkpoint.connectors.delta import evolution
from airflow_provider_checkpoint.exceptions import SinkSchemaError

STORED = StructType(
    [StructField("k", LongType(), False), StructField("v", StringType()), StructField("w", StringType())]
)


def test_missing_nullable_columns_are_filled_null_in_the_table_order_then_the_added_ones() -> None:
    missing = missing_fields("t", STORED, ["v", "k", "x"])
    assert [f.name for f in missing] == ["w"]
    rows = pa.table({"v": ["a", "b"], "k": [1, 2], "x": [1.5, None]})
    filled = filled_arrow(rows, STORED.fieldNames(), missing)
    assert filled.column_names == ["k", "v", "w", "x"]
    assert filled.to_pylist() == [{"k": 1, "v": "a", "w": None, "x": 1.5}, {"k": 2, "v": "b", "w": None, "x": None}]
    assert filled.schema.field("w").type == pa.string()
    with pytest.raises(SinkSchemaError, match=r"^t: the input lacks column\(s\) \['k'\], which the table declares NOT"):
        missing_fields("t", STORED, ["v", "w"])


def _file(path: Path, table: pa.Table, **options: object) -> TableFile:
    pq.write_table(table, path, row_group_size=2, **options)  # type: ignore[arg-type]
    return TableFile(str(path), path.stat().st_size)


def test_the_footers_tell_which_files_may_hold_a_value_in_a_missing_column(tmp_path: Path) -> None:
    fs = fsspec.filesystem("file")

    def may(name: str, table: pa.Table, columns: list[str], **options: object) -> bool:
        return may_hold_values(fs, _file(tmp_path / name, table, **options), columns)

    assert not may("nulls", pa.table({"k": [1, 2, 3], "w": pa.nulls(3, pa.string())}), ["w"])
    assert not may("lacking", pa.table({"k": [4, 5]}), ["w"])
    assert may("one", pa.table({"k": [6, 7, 8], "w": [None, None, "x"]}), ["w"])  # in the 2nd row group
    blind = pa.table({"k": [9], "w": pa.nulls(1, pa.string())})
    assert may("blind", blind, ["w"], write_statistics=False), "no statistics: may"
    empty_list = pa.table({"k": [1, 2], "w": pa.array([[], None], pa.list_(pa.string()))})
    assert may("nested", empty_list, ["w"]), "an empty list counts as null in its leaf"
    dotted = pa.table({"k": [1], "w.x": ["v"], "w": pa.nulls(1, pa.string())})
    assert not may("dotted", dotted, ["w"]) and may("dotted", dotted, ["w.x"])


def test_the_held_values_are_the_live_rows_with_a_value_keys_and_missing_columns_only(tmp_path: Path) -> None:
    fs = fsspec.filesystem("file")
    table = pa.table({"k": [1, 2, 3, 4, 5], "v": list("abcde"), "w": ["x", None, "z", None, "q"], "u": [None] * 5})
    file = _file(tmp_path / "a.parquet", table)
    assert held_values(fs, file, ["k"], ["w", "u", "gone"]).to_pylist() == [
        {"k": 1, "w": "x", "u": None, "gone": None},
        {"k": 3, "w": "z", "u": None, "gone": None},
        {"k": 5, "w": "q", "u": None, "gone": None},
    ]
    deleted = file._replace(deleted=lambda: np.array([0, 3], dtype=np.uint64))  # a deletion vector's rows
    assert held_values(fs, deleted, ["k"], ["w"]).to_pylist() == [{"k": 3, "w": "z"}, {"k": 5, "w": "q"}]


def test_each_file_keeps_the_order_and_raises_the_error() -> None:
    assert each_file(lambda i: i * 2, list(range(20))) == [i * 2 for i in range(20)]

    def fails(i: int) -> int:
        if i == 7:
            raise ValueError("seven")
        return i

    with pytest.raises(ValueError, match="seven"):
        each_file(fails, list(range(10)))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.integers(-2, 3)), max_size=8),
    st.lists(st.sampled_from(["a", "b", None]), max_size=8),
)
def test_held_rows_are_refused_when_they_hold_a_key_twice(ints: list[int | None], strings: list[str | None]) -> None:
    """One integer key (checked by a sort) and two keys (grouped): refused exactly when a key (a null is a value)
    repeats, as a Counter of the keys tells."""
    for keys, held in (
        (["k"], pa.table({"k": pa.array(ints, pa.int64())})),
        (["k", "s"], pa.table({"k": pa.array(ints[: len(strings)], pa.int64()), "s": strings[: len(ints)]})),
    ):
        repeated = max(Counter(zip(*(held[k].to_pylist() for k in keys), strict=True)).values(), default=0) > 1
        if repeated:
            with pytest.raises(SinkSchemaError, match="holds a key"):
                check_held_once("lake", keys, held)
        else:
            check_held_once("lake", keys, held)


def _delta_schema(**metadata: object) -> str:
    fields = [
        {"name": "k", "type": "long", "nullable": False, "metadata": {}},
        {"name": "w", "type": "string", "nullable": True, "metadata": metadata},
    ]
    return json.dumps({"type": "struct", "fields": fields})


def test_delta_writes_null_for_a_missing_plain_nullable_column_and_refuses_what_delta_computes() -> None:
    missing = evolution.missing("T", _delta_schema(), {}, ["k"])
    assert (missing.names, list(missing.order)) == (["w"], ["k", "w"])
    assert not evolution.missing("T", _delta_schema(), {}, ["k", "w"]).fields
    for schema, configuration, why in [
        (_delta_schema(), {"delta.columnMapping.mode": "name"}, "delta.columnMapping.mode=name"),
        (_delta_schema(CURRENT_DEFAULT="'x'"), {}, r"Delta computes the value of \['w'\]"),
        (_delta_schema(**{"delta.generationExpression": "upper(v)"}), {}, r"Delta computes the value of \['w'\]"),
    ]:
        with pytest.raises(SinkSchemaError, match=rf"^T: the input lacks column\(s\) \['w'\] and {why}"):
            evolution.missing("T", schema, configuration, ["k"])
    with pytest.raises(SinkSchemaError, match=r"\['k'\], which the table declares NOT NULL"):
        evolution.missing("T", _delta_schema(), {}, ["w"])


def test_rows_read_on_the_driver_are_filled_there_their_dataframe_made_only_if_asked() -> None:
    from airflow_provider_checkpoint.connectors.base.missing_columns import filled_upsert_rows
    from airflow_provider_checkpoint.connectors.base.upsert_rule import UpsertRows
    from airflow_provider_checkpoint.dataflow.driver_rows import SourceRows

    def no_spark() -> Any:
        raise AssertionError("no DataFrame made")

    given = StructType([StructField("v", StringType()), StructField("k", LongType(), False)])
    read = SourceRows(pa.table({"v": ["a"], "k": [1]}), given, no_spark)
    rows = UpsertRows("out", None, ["k"], [], True, count=1, read=read)
    filled = filled_upsert_rows(rows, STORED.fieldNames(), missing_fields("t", STORED, given.fieldNames()))
    assert filled.schema.fieldNames() == ["k", "v", "w"] and filled.count == 1 and filled.reduce
    assert filled.source is not None and filled.source.to_pylist() == [{"k": 1, "v": "a", "w": None}]
