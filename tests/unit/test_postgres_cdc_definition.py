"""PostgresCdcSource as defined (no server): arguments refused with the reason, the columns it adds, the
``delete_when`` an upsert sink must take, the spec a deferred sensor rebuilds it from, and text values typed
from the catalog's type OIDs (refusing what has no Spark type)."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from airflow_provider_checkpoint.connectors.postgres.cdc_types import TableColumn, converter
from airflow_provider_checkpoint.dataflow import ParquetTableSink, PostgresCdcSource
from airflow_provider_checkpoint.exceptions import CdcSourceError, PipelineDefinitionError
from airflow_provider_checkpoint.triggers.checkpoint import source_from_spec, source_spec
from tests.unit.test_validation import problems


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({}, "give tables, or the publication"),
        ({"tables": []}, "tables is empty"),
        ({"tables": ["a.b.c"]}, "is not a table name"),
        ({"tables": ['x"; drop table y']}, "is not a table name"),
        ({"tables": ["t"], "slot_name": "Bad-Slot"}, "slot_name must be"),
        ({"publication": "p" * 64}, "publication must be"),
        ({"tables": ["t"], "driver_read_bytes": -1}, "driver_read_bytes must be an int >= 0"),
        ({"tables": ["t"], "driver_read_bytes": 1.5}, "driver_read_bytes must be an int >= 0"),
    ],
)
def test_bad_definitions_are_refused(kwargs, why):
    with pytest.raises(PipelineDefinitionError, match=why):
        PostgresCdcSource("cdc", **kwargs)


def test_columns_delete_when_and_the_sensor_spec(tmp_path: Path):
    source = PostgresCdcSource("cdc", ["Orders", "sales.items"], postgres_conn_id="shop", slot_name="s1")
    assert source.tables == ["public.orders", "sales.items"]
    assert source.added_columns().startswith("source_table STRING, op STRING, deleted BOOLEAN, lsn BIGINT")
    forgot = ParquetTableSink("forgot", source, str(tmp_path / "f"), mode="upsert", keys=["id"])
    ok = ParquetTableSink("ok", source, str(tmp_path / "o"), mode="upsert", keys=["id"], delete_when="deleted")
    assert [(p.uid, p.field) for p in problems([source, forgot, ok])] == [("forgot", "delete_when")]
    spec = json.loads(json.dumps(source_spec(source)))
    rebuilt = source_from_spec(spec)
    assert isinstance(rebuilt, PostgresCdcSource) and source_spec(rebuilt) == spec
    assert (rebuilt.tables, rebuilt.slot_name, rebuilt.postgres_conn_id) == (source.tables, "s1", "shop")


def column(type_oid: int, modifier: int = -1, name: str = "c") -> TableColumn:
    return TableColumn("public.t", name, type_oid, modifier, f"type {type_oid}", False)


@pytest.mark.parametrize(
    ("oid", "modifier", "text", "value"),
    [
        (16, -1, "t", True),
        (16, -1, "false", False),
        (21, -1, "-7", -7),
        (20, -1, "9223372036854775807", 2**63 - 1),
        (1700, (12 << 16) + 3 + 4, "-123.450", Decimal("-123.450")),
        (701, -1, "-Infinity", float("-inf")),
        (1082, -1, "2024-02-29", date(2024, 2, 29)),
        (1114, -1, "2024-02-29 01:02:03.5", datetime(2024, 2, 29, 1, 2, 3, 500000)),
        (1184, -1, "2024-02-29 01:02:03.000001+00", datetime(2024, 2, 29, 1, 2, 3, 1, tzinfo=UTC)),
        (2950, -1, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
        (3802, -1, '{"a": 1}', '{"a": 1}'),
        (25, -1, None, None),
    ],
)
def test_text_values_are_typed_by_their_oid(oid, modifier, text, value):
    assert converter(column(oid, modifier))(text) == value


def test_types_and_values_without_a_spark_equivalent_are_refused_naming_the_column():
    with pytest.raises(CdcSourceError, match="column geo of table public.t has type type 600, which the CDC"):
        column(600, name="geo").spark_type()
    with pytest.raises(CdcSourceError, match="numeric without precision and scale"):
        column(1700).spark_type()
    with pytest.raises(CdcSourceError, match=r"is numeric\(40, 2\)"):
        column(1700, (40 << 16) + 2 + 4).spark_type()
    with pytest.raises(CdcSourceError, match="column c of table public.t: value 'infinity' of type type 1082"):
        converter(column(1082))("infinity")
    with pytest.raises(CdcSourceError, match="value 'NaN'"):
        converter(column(1700, (10 << 16) + 2 + 4))("NaN")
