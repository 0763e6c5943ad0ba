"""Every way a keyed aggregate's state is merged gives the same state, and the distinct count keeps its bound.

The four merges of :class:`KeyedAggregate` — one aggregation of input rows with state rows, of
per-key partials with state rows, a join of state with partials, and pyarrow on the driver —
over an input split into checkpoints, with null keys, null values and ties on the ordering
columns; each against the state of one aggregation over the whole input, and against pandas.
"""

from __future__ import annotations

import random

import pandas as pd
import pytest

from airflow_provider_checkpoint.dataflow import FileSource, KeyedAggregate
from airflow_provider_checkpoint.dataflow.aggregates import HLL_LG_K
from airflow_provider_checkpoint.dataflow.operator import NEW

pytestmark = pytest.mark.spark

SCHEMA = "user STRING, page STRING, amount LONG, ts LONG"
AGGS = {
    "n": "count(page)",
    "mean": "avg(amount)",
    "first_page": "first(page, ts)",
    "last_page": "last(page, ts)",
    "low_page": "min_by(page, amount)",
    "top_page": "max_by(page, amount)",
    "pages": "collect_set(page, 2)",
    "times": "approx_count_distinct(ts)",
}


def node(aggs: dict[str, str]) -> KeyedAggregate:
    events = FileSource("events", "/tmp/landing", "json", SCHEMA)
    return KeyedAggregate("stats", events, keys=["user"], aggs=aggs)


def events(rng: random.Random, n: int) -> list[tuple[object, ...]]:
    return [
        (
            rng.choice([None, "", "u1", "u2", "u3"]),
            rng.choice([None, "/a", "/b", "/c"]),
            rng.choice([None, 1, 2, 3]),
            rng.choice([None, *range(6)]),
        )
        for _ in range(n)
    ]


def rows(df) -> dict[object, dict[str, object]]:
    """State rows by key, sketches as their estimates (their bytes may hold hashes in another order)."""
    from pyspark.sql import functions as F

    out = (
        df.withColumn("__times__sketch", F.hll_sketch_estimate("__times__sketch"))
        if "__times__sketch" in df.columns
        else df
    )
    return {r["user"]: r for r in (row.asDict(recursive=True) for row in out.drop(NEW, "__touched").collect())}


def test_every_merge_gives_the_state_of_one_aggregation(spark):
    from pyspark.sql import functions as F

    rng = random.Random(3)
    agg = node(AGGS)
    parts = [spark.createDataFrame(events(rng, n), SCHEMA) for n in (40, 1, 60, 25)]
    whole = parts[0]
    for p in parts[1:]:
        whole = whole.unionByName(p)
    want = rows(agg._partial(whole))
    spark_only = agg._partial(parts[0])
    by_partials = joined = spark_only
    for p in parts[1:]:
        spark_only = agg._aggregated_with(spark_only, p).drop("__touched", NEW).localCheckpoint()
        by_partials = agg._aggregated_with(by_partials, agg._partial(p), True).drop("__touched", NEW).localCheckpoint()
        batch = agg._partial(p)
        merged = agg._merged(joined, batch).drop(NEW)
        touched = batch.select(F.col("user").alias("__user"))
        untouched = joined.join(touched, joined["user"].eqNullSafe(F.col("__user")), "left_anti")
        joined = untouched.unionByName(merged).localCheckpoint()
    assert rows(spark_only) == want
    assert rows(by_partials) == want
    assert rows(joined) == want
    # the driver merges what it can (no set, no sketch) as Spark does
    simple = node({k: v for k, v in AGGS.items() if k not in ("pages", "times")})
    state = _nullable(simple._partial(parts[0]).toArrow())  # as state files are read
    for p in parts[1:]:
        merged = simple.merge_arrow(state, _nullable(simple._partial(p).toArrow()))
        state = _overlay(state, merged.select(state.column_names))
    driver = {r["user"]: r for r in state.to_pylist()}
    assert driver == {u: {k: v for k, v in r.items() if k not in ("pages", "__times__sketch")} for u, r in want.items()}
    # and the definitions, in pandas
    pdf = whole.toPandas()
    check(rows(agg.output_of(agg._partial(whole))), pdf)


def _nullable(table):
    import pyarrow as pa

    return table.cast(pa.schema([f.with_nullable(True) for f in table.schema]))


def _overlay(state, fresh):
    import pyarrow as pa

    changed = set(fresh["user"].to_pylist())
    kept = pa.Table.from_pylist([r for r in state.to_pylist() if r["user"] not in changed], state.schema)
    return pa.concat_tables([kept, fresh.cast(state.schema)])


def check(got: dict[object, dict[str, object]], pdf: pd.DataFrame) -> None:
    for user in set(pdf["user"].tolist()):
        g = pdf[pdf["user"].isna()] if user is None else pdf[pdf["user"] == user]
        row = got[user]
        amounts = g["amount"].dropna()
        assert row["mean"] == (pytest.approx(amounts.mean()) if len(amounts) else None)
        with_ts = g[g["ts"].notna()]
        with_both = with_ts[with_ts["page"].notna()]
        assert row["first_page"] == (
            min(with_both[with_both["ts"] == with_both["ts"].min()]["page"]) if len(with_both) else None
        )
        assert row["last_page"] == (
            max(with_both[with_both["ts"] == with_both["ts"].max()]["page"]) if len(with_both) else None
        )
        with_amount = g[g["amount"].notna()]
        lows = with_amount[with_amount["amount"] == with_amount["amount"].min()]["page"]
        tops = with_amount[with_amount["amount"] == with_amount["amount"].max()]["page"]
        assert row["low_page"] == (None if not len(lows) or lows.isna().any() else min(lows))  # null lowest
        assert row["top_page"] == (None if not len(tops) or tops.isna().all() else max(tops.dropna()))
        pages = sorted(set(g["page"].dropna()))[:2]
        assert row["pages"] == (pages or None)
        assert row["times"] == g["ts"].nunique()


def test_the_distinct_count_keeps_its_error_bound_and_is_the_same_however_the_input_was_split(spark):
    """Three keys of 300, 8,000 and 60,000 distinct values, merged over checkpoints split two ways:
    the same estimate both ways, within 4.9% (three standard errors) of the exact count."""
    from pyspark.sql import functions as F

    agg = node({"times": "approx_count_distinct(ts)"})
    exact = {"u1": 300, "u2": 8_000, "u3": 60_000}
    data = (
        spark.range(60_000)
        .select(
            F.explode(F.array(*[F.when(F.col("id") < n, F.lit(u)) for u, n in exact.items()])).alias("user"),
            (F.col("id") * 7919).alias("ts"),
            F.lit("/a").alias("page"),
            F.lit(1).cast("long").alias("amount"),
        )
        .where("user IS NOT NULL")
    )
    estimates = []
    for splits in (2, 5):
        parts = data.randomSplit([1.0] * splits, seed=splits)
        state = agg._partial(parts[0])
        for p in parts[1:]:
            state = agg._aggregated_with(state, p).drop("__touched", NEW).localCheckpoint()
        estimates.append({r["user"]: r["times"] for r in agg.output_of(state).collect()})
    assert estimates[0] == estimates[1]
    for user, n in exact.items():
        assert abs(estimates[0][user] - n) <= 0.049 * n, (user, estimates[0][user], n, HLL_LG_K)
