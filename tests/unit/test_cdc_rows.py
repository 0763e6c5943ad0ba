"""cdc_rows.typed: Arrow's parse of integers and floats gives what the Python converter gives; a value it
cannot parse goes to the converter, whose error names the column."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

from airflow_provider_checkpoint.connectors.postgres.cdc_rows import typed
from airflow_provider_checkpoint.connectors.postgres.cdc_types import TableColumn, converter
from airflow_provider_checkpoint.exceptions import CdcSourceError


def column(oid: int, name: str) -> TableColumn:
    return TableColumn("public.t", "c", oid, -1, name, False)


@pytest.mark.parametrize(
    ("oid", "name", "texts"),
    [
        (20, "bigint", ["0", "-9223372036854775808", "9223372036854775807", None]),
        (21, "smallint", ["-32768", "32767", None]),
        (701, "double precision", ["0.1", "-2.5e+300", "1.7976931348623157e+308", "5e-324", "NaN", "Infinity", None]),
        (700, "real", ["0.1", "3.4028235e+38", "-Infinity", None]),
        (25, "text", ["", "a\nb", "çé", None]),
        (16, "boolean", ["t", "f", None]),
    ],
)
def test_arrow_parses_as_the_converter_does(oid, name, texts):
    col = column(oid, name)
    want = pa.array([converter(col)(t) for t in texts], col.arrow_type()).to_pylist()
    for given in (texts, pa.array(texts, pa.string())):
        got = typed(col, given).to_pylist()
        assert [("nan" if isinstance(v, float) and math.isnan(v) else v) for v in got] == [
            ("nan" if isinstance(v, float) and math.isnan(v) else v) for v in want
        ]


def test_a_value_arrow_cannot_parse_is_refused_naming_the_column():
    with pytest.raises(CdcSourceError, match="column c of table public.t: value 'x1'"):
        typed(column(23, "integer"), ["1", "x1"])
