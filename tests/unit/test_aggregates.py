"""Aggregate specs and the driver's (pyarrow) combine of a keyed aggregate's state, against plain Python."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from airflow_provider_checkpoint.core.event_time import WatermarkProgress
from airflow_provider_checkpoint.dataflow import FileSource, KeyedAggregate
from airflow_provider_checkpoint.dataflow.operator import NEW
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError
from airflow_provider_checkpoint.state.driver_merge import held_partials

AGGS = {
    "n": "count",
    "total": "sum(amount)",
    "mean": "avg(amount)",
    "first_page": "first(page, ts)",
    "last_page": "last(page, ts)",
    "low_page": "min_by(page, amount)",
    "top_page": "max_by(page, amount)",
}


def aggregate(aggs: dict[str, str], uid: str = "stats") -> KeyedAggregate:
    events = FileSource("events", "/tmp/landing", "json", "user STRING, page STRING, amount LONG, ts LONG")
    return KeyedAggregate(uid, events, keys=["user"], aggs=aggs)


def test_specs_parse_to_their_canonical_form_and_the_columns_they_read():
    node = aggregate(
        {
            **AGGS,
            "pages": " collect_set( page , 3 ) ",
            "users": "approx_count_distinct(user)",
            "all": "count(*)",
            "some": "count()",
        }
    )
    assert node.describe()["aggs"] == {
        "n": "count(*)",
        "total": "sum(amount)",
        "mean": "avg(amount)",
        "first_page": "first(page, ts)",
        "last_page": "last(page, ts)",
        "low_page": "min_by(page, amount)",
        "top_page": "max_by(page, amount)",
        "pages": "collect_set(page, 3)",
        "users": "approx_count_distinct(user)",
        "all": "count(*)",
        "some": "count(*)",
    }
    assert node.input_columns() == ("amount", "page", "ts", "user")
    assert node.aggs["mean"].state_columns() == ("__mean__sum", "__mean__count")
    assert node.aggs["first_page"].state_columns() == ("first_page", "__first_page__by")
    assert node.aggs["users"].state_columns() == ("__users__sketch",)
    assert node.aggs["pages"].state_columns() == ("pages",)


@pytest.mark.parametrize(
    "spec",
    [
        "avg()",
        "avg(*)",
        "collect_set(page, -1)",
        "collect_set(page, 0)",
        "collect_set(page)",
        "median(amount)",
        "first(page)",
        "max_by(page, amount, ts)",
        "sum(a b)",
        "",
    ],
)
def test_a_bad_spec_names_the_operator_and_the_allowed_forms(spec):
    with pytest.raises(PipelineDefinitionError, match=r"^stats: aggregate x=.* is not one of count, .*avg\(col\)"):
        aggregate({"x": spec})


def test_an_aggregate_column_may_not_look_hidden():
    with pytest.raises(PipelineDefinitionError, match="stats: aggregate column '__x' must not start with '__'"):
        aggregate({"__x": "count"})


def _state_rows(rng: random.Random, users: list[str | None], rows: int) -> list[dict[str, object]]:
    """Random per-key state rows of :data:`AGGS` (as a partial or a restored state holds them)."""
    out = []
    for user in users:
        for _ in range(rows):
            count = rng.choice([0, 1, 3])
            ts, amount = rng.choice([None, 1, 2, 3]), rng.choice([None, 1, 2])
            page = lambda: rng.choice([None, "/a", "/b", "/c"])  # noqa: E731
            first_page = page() if ts is not None else None
            out.append(
                {
                    "user": user,
                    "n": rng.randrange(5),
                    "total": rng.choice([None, rng.randrange(9)]),
                    "__mean__sum": rng.randrange(9) if count else None,
                    "__mean__count": count,
                    "first_page": first_page,
                    "__first_page__by": ts if first_page is not None else None,
                    "last_page": first_page,
                    "__last_page__by": ts if first_page is not None else None,
                    "low_page": page() if amount is not None else None,
                    "__low_page__by": amount,
                    "top_page": page() if amount is not None else None,
                    "__top_page__by": amount,
                }
            )
    return out


def _best(rows: list[dict[str, object]], out: str, smallest: bool) -> tuple[object, object]:
    """The (value, order) of ``out`` by the definition: the smallest/largest order, then value (null lowest)."""
    pairs = [(r[f"__{out}__by"], r[out]) for r in rows if r[f"__{out}__by"] is not None]
    if not pairs:
        return None, None
    rank = sorted(pairs, key=lambda p: (p[0], p[1] is not None, p[1] or ""))
    by, value = rank[0] if smallest else rank[-1]
    return value, by


def _oracle(state: list[dict[str, object]], partials: list[dict[str, object]]) -> dict[object, dict[str, object]]:
    want: dict[object, dict[str, object]] = {}
    for user in {p["user"] for p in partials}:
        rows = [r for r in state + partials if r["user"] == user]
        sums = [r["total"] for r in rows if r["total"] is not None]
        means = [r["__mean__sum"] for r in rows if r["__mean__sum"] is not None]
        row: dict[str, object] = {
            "n": sum(r["n"] for r in rows),
            "total": sum(sums) if sums else None,
            "__mean__sum": sum(means) if means else None,
            "__mean__count": sum(r["__mean__count"] for r in rows),
            NEW: not any(r["user"] == user for r in state),
        }
        for out, smallest in (("first_page", True), ("last_page", False), ("low_page", True), ("top_page", False)):
            row[out], row[f"__{out}__by"] = _best(rows, out, smallest)
        want[user] = row
    return want


@pytest.mark.parametrize("seed", range(5))
def test_the_driver_combine_follows_each_aggregate_s_definition(seed):
    """Null keys, null values and ties on the order: each key's merged state is what the definitions
    give over its state row and its partial rows (several per key here, as several checkpoints give)."""
    rng = random.Random(seed)
    node = aggregate(AGGS)
    users: list[str | None] = [None, "", "u1", "u2", "u3", "u4"]
    columns = ["user", *node._state_columns]
    state = _state_rows(rng, rng.sample(users, 3), 1)
    partials = _state_rows(rng, rng.sample(users, 4), 2)
    types = {c: pa.int64() for c in columns if c.startswith(("__", "n", "total"))}
    schema = pa.schema([(c, types.get(c, pa.string())) for c in columns])
    merged = node.merge_arrow(pa.Table.from_pylist(state, schema), pa.Table.from_pylist(partials, schema))
    got = {r.pop("user"): r for r in merged.to_pylist()}
    assert got == _oracle(state, partials)
    shown = node.output_arrow(merged.select(columns))
    assert shown is not None and shown.column_names == ["user", *AGGS]
    for row in shown.to_pylist():
        count, total = got[row["user"]]["__mean__count"], got[row["user"]]["__mean__sum"]
        assert row["mean"] == (total / count if count else None)


def test_sketches_and_sets_are_merged_by_spark_only():
    node = aggregate({"pages": "collect_set(page, 2)"})
    assert node.partials({}) is None
    node = aggregate({"users": "approx_count_distinct(user)"})
    assert node.partials({}) is None


def test_the_driver_reduces_held_rows_only_for_an_operator_without_event_time():
    """:func:`held_partials` of rows a source read on the driver: the partials without a watermark; none with one
    (``before``: an operator with event time, whose partials leave late rows out), so Spark computes those."""
    node = aggregate({"n": "count", "last": "max(ts)"})
    rows = pa.Table.from_pylist(
        [{"user": "a", "page": "p", "amount": 1, "ts": 5}, {"user": "a", "page": "q", "amount": 2, "ts": 7}],
        pa.schema([("user", pa.string()), ("page", pa.string()), ("amount", pa.int64()), ("ts", pa.int64())]),
    )
    partials = held_partials(node, {"events": rows}, None)
    assert partials is not None and partials.select(["user", "n", "last"]).to_pylist() == [
        {"user": "a", "n": 2, "last": 7}
    ]
    assert held_partials(node, {"events": rows}, WatermarkProgress()) is None
