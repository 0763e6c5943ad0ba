"""State merged with pyarrow on the driver: overlaying deltas and KeyedAggregate's Arrow merge,
each checked against a plain-Python model of the same rule."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from airflow_provider_checkpoint.connectors.files.source import FileSource
from airflow_provider_checkpoint.dataflow.operator import NEW
from airflow_provider_checkpoint.dataflow.stateful import KeyedAggregate
from airflow_provider_checkpoint.state.files import DELETED, SEQ, overlay

Key = tuple[Any, ...]


def rows_by_key(table: pa.Table, keys: list[str]) -> dict[Key, dict[str, Any]]:
    out: dict[Key, dict[str, Any]] = {}
    for row in table.to_pylist():
        key = tuple(row[k] for k in keys)
        assert key not in out, f"key {key} twice"
        out[key] = row
    return out


def random_rows(rng: random.Random, n: int, nulls: bool) -> list[dict[str, Any]]:
    keys = [None] if nulls else []
    keys += [f"k{i}" for i in range(40)]
    return [{"k": rng.choice(keys), "g": rng.randint(0, 2), "v": rng.randint(-5, 5)} for _ in range(n)]


@pytest.mark.parametrize("nulls", [False, True])
@pytest.mark.parametrize("layers", [1, 3])
def test_overlay_applies_the_newest_change_per_key(nulls: bool, layers: int) -> None:
    rng = random.Random(layers * 10 + nulls)
    base = list({(r["k"], r["g"]): r for r in random_rows(rng, 80, nulls)}.values())
    changes = [  # each checkpoint's delta holds a key once
        {**row, DELETED: rng.random() < 0.3, SEQ: seq}
        for seq in range(1, layers + 1)
        for row in {(r["k"], r["g"]): r for r in random_rows(rng, 30, nulls)}.values()
    ]
    rng.shuffle(changes)
    expected = {(r["k"], r["g"]): r for r in base}
    for change in sorted(changes, key=lambda c: c[SEQ]):
        key = (change["k"], change["g"])
        if change[DELETED]:
            expected.pop(key, None)
        else:
            expected[key] = {"k": change["k"], "g": change["g"], "v": change["v"]}
    schema = pa.schema([("k", pa.string()), ("g", pa.int64()), ("v", pa.int64())])
    delta_schema = schema.append(pa.field(DELETED, pa.bool_())).append(pa.field(SEQ, pa.int64()))
    got = overlay(pa.Table.from_pylist(base, schema), pa.Table.from_pylist(changes, delta_schema), ["k", "g"])
    assert got.schema == schema
    assert rows_by_key(got, ["k", "g"]) == expected


def test_overlay_onto_a_range_without_a_full_version() -> None:
    empty = pa.table({"k": pa.nulls(0), "v": pa.nulls(0)})
    changes = pa.table({"k": ["a", "b"], "v": [1, 2], DELETED: [False, True], SEQ: [3, 3]})
    assert overlay(empty, changes, ["k"]).to_pylist() == [{"k": "a", "v": 1}]


@pytest.mark.parametrize("nulls", [False, True])
def test_keyed_aggregate_merges_partials_like_a_recount(nulls: bool) -> None:
    node = KeyedAggregate(
        "agg",
        FileSource("events", "/tmp/landing", "json", "k STRING, v LONG"),
        keys=["k"],
        aggs={"n": "count", "total": "sum(v)", "low": "min(v)", "high": "max(v)", "seen": "count(v)"},
    )
    rng = random.Random(7 + nulls)
    before = random_rows(rng, 300, nulls)
    batch = random_rows(rng, 100, nulls)
    for row in rng.sample(batch, 10):
        row["v"] = None

    def aggregate(rows: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
        out: dict[Key, dict[str, Any]] = {}
        for row in rows:
            a = out.setdefault(
                (row["k"],), {"k": row["k"], "n": 0, "total": None, "low": None, "high": None, "seen": 0}
            )
            a["n"] += 1
            if row["v"] is not None:
                a["seen"] += 1
                a["total"] = row["v"] + (a["total"] or 0)
                a["low"] = row["v"] if a["low"] is None else min(a["low"], row["v"])
                a["high"] = row["v"] if a["high"] is None else max(a["high"], row["v"])
        return out

    old, new, whole = aggregate(before), aggregate(batch), aggregate(before + batch)
    schema = pa.schema([("k", pa.string())] + [(c, pa.int64()) for c in ("n", "total", "low", "high", "seen")])
    state = pa.Table.from_pylist(list(old.values()), schema)
    partials = pa.Table.from_pylist(list(new.values()), schema.append(pa.field("__kgr", pa.int32())))
    partials = partials.set_column(
        partials.schema.get_field_index("__kgr"), "__kgr", pa.array([1] * len(new), pa.int32())
    )
    got = rows_by_key(node.merge_arrow(state, partials), ["k"])
    assert set(got) == set(new)
    for key, row in got.items():
        assert {c: row[c] for c in schema.names} == whole[key]
        assert row[NEW] is (key not in old)
        assert row["__kgr"] == 1
