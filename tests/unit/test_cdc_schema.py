"""The schema changes a PostgresCdcSource follows (pure Python): recorded columns only grow, types only widen."""

from __future__ import annotations

import pytest

from airflow_provider_checkpoint.connectors.postgres.cdc_schema import check_sent, evolve, from_json, to_json, widens
from airflow_provider_checkpoint.connectors.postgres.cdc_types import TableColumn
from airflow_provider_checkpoint.exceptions import CdcSourceError

INT2, INT4, INT8, FLOAT4, FLOAT8, NUMERIC, TEXT, VARCHAR, BPCHAR, BOOL, DATE = (
    21,
    23,
    20,
    700,
    701,
    1700,
    25,
    1043,
    1042,
    16,
    1082,
)


def col(name: str, oid: int, modifier: int = -1, type_name: str = "") -> TableColumn:
    return TableColumn("s.t", name, oid, modifier, type_name or f"oid{oid}", name == "id")


def numeric(p: int, s: int) -> int:
    return (p << 16) + s + 4


@pytest.mark.parametrize(
    ("old", "new", "safe"),
    [
        ((INT4, -1), (INT8, -1), True),
        ((INT2, -1), (INT4, -1), True),
        ((INT8, -1), (INT4, -1), False),
        ((FLOAT4, -1), (FLOAT8, -1), True),
        ((FLOAT8, -1), (FLOAT4, -1), False),
        ((VARCHAR, 14), (TEXT, -1), True),  # varchar(10): typmod 10 + 4
        ((VARCHAR, 14), (VARCHAR, 24), True),
        ((VARCHAR, 24), (VARCHAR, 14), False),
        ((VARCHAR, 14), (VARCHAR, -1), True),
        ((TEXT, -1), (VARCHAR, 14), False),
        ((BPCHAR, 9), (TEXT, -1), True),
        ((INT4, -1), (NUMERIC, numeric(12, 2)), True),
        ((INT4, -1), (NUMERIC, numeric(10, 2)), False),  # 8 digits before the point < int4's 10
        ((NUMERIC, numeric(10, 2)), (NUMERIC, numeric(12, 3)), True),
        ((NUMERIC, numeric(10, 2)), (NUMERIC, numeric(12, 1)), False),
        ((NUMERIC, numeric(10, 2)), (NUMERIC, numeric(10, 3)), False),
        ((INT4, -1), (TEXT, -1), False),
        ((BOOL, -1), (INT4, -1), False),
        ((DATE, -1), (DATE, -1), True),
    ],
)
def test_only_types_every_old_value_keeps_its_meaning_in_widen(old, new, safe):
    assert widens(col("c", *old), col("c", *new)) is safe


def test_added_columns_are_appended_dropped_ones_kept_widened_ones_retyped():
    known = [col("id", INT4), col("gone", TEXT), col("n", INT4)]
    now = [col("id", INT4), col("n", INT8), col("note", TEXT)]
    assert [(c.name, c.type_oid) for c in evolve("src", known, now, set())] == [
        ("id", INT4),
        ("gone", TEXT),
        ("n", INT8),
        ("note", TEXT),
    ]
    assert evolve("src", known, known, {"gone"}) == known
    assert from_json("src", "s.t", to_json(known)) == known


def test_a_type_change_that_does_not_widen_is_refused_naming_table_column_and_both_types():
    known = [col("id", INT4), col("n", INT8, type_name="bigint")]
    with pytest.raises(CdcSourceError, match=r"column n of table s.t changed type from bigint to integer.*TYPE bigint"):
        evolve("src", known, [col("id", INT4), col("n", INT4, type_name="integer")], set())


def test_a_column_added_with_a_default_the_existing_rows_hold_is_refused():
    known = [col("id", INT4)]
    now = [*known, col("flag", BOOL, type_name="boolean")]
    with pytest.raises(
        CdcSourceError, match=r"column flag of table s.t was added with a default.*ADD COLUMN flag boolean"
    ):
        evolve("src", known, now, {"flag"})


def test_a_wal_value_is_read_into_a_recorded_column_that_widens_it_and_skipped_if_dropped_before_the_barrier():
    known = {"id": col("id", INT4), "n": col("n", INT8)}
    assert check_sent("src", known, "n", INT4, -1) is True  # a row written before int4 -> int8
    assert check_sent("src", known, "tmp", TEXT, -1) is False  # added and dropped within the span
    with pytest.raises(CdcSourceError, match="column id of table s.t changed type"):
        check_sent("src", known, "id", INT8, -1)  # int8 in the WAL, int4 recorded: would not fit
