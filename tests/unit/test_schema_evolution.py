"""``schema_evolution`` without a server: option values, what the PostgreSQL commit would add or widen (and the
retypes it refuses), the Delta ``metaData`` a commit carries and the committables naming added columns."""

from __future__ import annotations

import json
from typing import Any

import pytest
from deltalake.schema import Schema
from pyspark.sql import types as T

from airflow_provider_checkpoint.connectors.delta import evolution
from airflow_provider_checkpoint.connectors.delta.files import read_delta_committables
from airflow_provider_checkpoint.connectors.delta.sink import DeltaTableSink
from airflow_provider_checkpoint.connectors.postgres import target
from airflow_provider_checkpoint.connectors.postgres.sink import PostgresTableSink
from airflow_provider_checkpoint.dataflow.graph import Source
from airflow_provider_checkpoint.exceptions import DocumentError, PipelineDefinitionError, SinkSchemaError


def _pg(**kwargs: Any) -> PostgresTableSink:
    return PostgresTableSink("out", Source("src"), "pg_unit", "marts.facts", **kwargs)


def test_bad_option_values_are_refused_when_the_pipeline_is_defined(tmp_path):
    with pytest.raises(PipelineDefinitionError, match=r"schema_evolution must be one of \['none', 'additive'\]"):
        _pg(schema_evolution="add_columns")
    with pytest.raises(PipelineDefinitionError, match="schema_evolution must be one of"):
        DeltaTableSink("lake", Source("src"), str(tmp_path), schema_evolution="mergeSchema")
    with pytest.raises(PipelineDefinitionError, match="not available with partition_per_checkpoint"):
        _pg(schema_evolution="additive", partition_per_checkpoint=True)
    assert "schema_evolution" not in _pg().describe()
    assert _pg(schema_evolution="additive").describe()["schema_evolution"] == "additive"
    lake = DeltaTableSink("lake", Source("src"), str(tmp_path), schema_evolution="additive")
    assert lake.describe()["schema_evolution"] == "additive"


def test_the_postgres_step_stages_added_and_widened_columns_and_refuses_other_number_retypes():
    table = {"id": "integer", "n": "integer", "x": "real", "s": "smallint", "v": "character varying(10)"}
    schema = T.StructType(
        [
            T.StructField("id", T.IntegerType()),
            T.StructField("n", T.LongType()),  # widened
            T.StructField("x", T.DoubleType()),  # widened
            T.StructField("s", T.ByteType()),  # the same PostgreSQL type
            T.StructField("v", T.StringType()),  # not a number: the table's type is kept
            T.StructField("note", T.TimestampType()),  # added
        ]
    )
    evolved = target._evolved(_pg(schema_evolution="additive"), schema, table)
    assert evolved == {"n": "bigint", "x": "double precision", "note": "timestamp with time zone"}
    assert target._evolved(_pg(), schema, table) == {}
    narrower = T.StructType([T.StructField("n", T.ShortType())])
    assert target._evolved(_pg(schema_evolution="additive"), narrower, {"n": "bigint"}) == {}
    retyped = T.StructType([T.StructField("n", T.DoubleType())])
    with pytest.raises(SinkSchemaError, match="column n of marts.facts .* is integer, the input's is double precision"):
        target._evolved(_pg(schema_evolution="additive"), retyped, {"n": "integer"})


def _metadata(fields: list[dict[str, Any]], **config: str) -> dict[str, Any]:
    schema = {"type": "struct", "fields": fields}
    return {"id": "t", "format": {"provider": "parquet"}, "schemaString": json.dumps(schema), "configuration": config}


def test_the_delta_commit_appends_the_missing_nullable_fields_to_the_table_schema():
    import pyarrow as pa

    id_field = {"name": "id", "type": "integer", "nullable": True, "metadata": {}}
    table = {"id": "integer"}
    added = evolution.added_columns(table, Schema.from_arrow(pa.schema([("id", pa.int32()), ("note", pa.string())])))
    assert added == [{"name": "note", "type": "string", "nullable": True, "metadata": {}}]
    grown = evolution.grown_metadata("t", _metadata([id_field]), added)
    assert grown is not None and grown["id"] == "t"
    assert [f["name"] for f in json.loads(grown["schemaString"])["fields"]] == ["id", "note"]
    assert evolution.grown_metadata("t", grown, added) is None, "a column the table has is not added again"
    assert evolution.grown_metadata("t", _metadata([id_field]), []) is None
    other = [{**added[0], "type": "long"}]
    with pytest.raises(SinkSchemaError, match='column note was added since .* "string", the staged rows have "long"'):
        evolution.grown_metadata("t", grown, other)
    with pytest.raises(SinkSchemaError, match="delta.columnMapping.mode=name"):
        evolution.grown_metadata("t", _metadata([id_field], **{"delta.columnMapping.mode": "name"}), added)


def test_committables_naming_added_columns_are_read_only_well_formed():
    def read(columns: Any) -> Any:
        committables = [{"checkpoint_id": 3, "adds": [], "removes": [], "add_columns": columns}]
        return read_delta_committables(3, committables, False, [], 0, "doc").columns

    note = {"name": "note", "type": "string", "nullable": True, "metadata": {}}
    assert read([note]) == [note]
    with pytest.raises(DocumentError, match="must be nullable Delta fields"):
        read([{**note, "nullable": False}])
    with pytest.raises(DocumentError, match="name a column twice"):
        read([note, note])
    with pytest.raises(DocumentError, match="are not Delta fields"):
        read([{**note, "type": "no such type"}])


def test_update_files_written_before_and_after_an_added_column_merge_into_one_with_nulls(tmp_path):
    import fsspec
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_provider_checkpoint.connectors.delta import upsert
    from airflow_provider_checkpoint.connectors.delta.log import DataFile

    before = pa.table({"id": pa.array([1, 2, 3], pa.int32()), "n": pa.array([10, 20, 30], pa.int32())})
    after = pa.table({"id": pa.array([4, 5], pa.int32()), "n": pa.array([40, 50], pa.int32()), "note": ["d", None]})
    sources = []
    for name, rows, deleted in [("a.parquet", before, [1]), ("b.parquet", after, []), ("c.parquet", before, [])]:
        pq.write_table(rows, tmp_path / name)
        size = (tmp_path / name).stat().st_size
        sources.append((DataFile(name, (), size=size), np.array(deleted, dtype=np.uint64)))
    fs = fsspec.filesystem("file")
    written = upsert._merge(fs, str(tmp_path), sources, str(tmp_path / "out.parquet"), "doc")
    merged = pq.read_table(tmp_path / "out.parquet")
    assert written == 7 and merged.column_names == ["id", "n", "note"]
    assert merged.to_pylist() == [
        {"id": 1, "n": 10, "note": None},
        {"id": 3, "n": 30, "note": None},
        {"id": 4, "n": 40, "note": "d"},
        {"id": 5, "n": 50, "note": None},
        *({"id": i, "n": 10 * i, "note": None} for i in (1, 2, 3)),
    ]
