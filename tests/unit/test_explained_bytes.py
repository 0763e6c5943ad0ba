"""The size of a plan from Spark's cost explain (the estimate a Spark Connect client gets): the optimized plan's
root, in Spark's units, rounded up; ``None`` where the text has none. Texts as Spark 4.2's ``explain(mode="cost")``
prints them (``Utils.bytesToString``: one decimal, B below 2 KiB)."""

from __future__ import annotations

import math

import pytest

from airflow_provider_checkpoint.dataflow.driver_rows import explained_bytes

AGGREGATE = """== Optimized Logical Plan ==
Aggregate [user#880], [user#880, count(1) AS count#883L], Statistics(sizeInBytes=6.5 MiB)
+- Project [user#880], Statistics(sizeInBytes=5.1 MiB)
   +- Relation [user#880,page#881,ts#882L] json, Statistics(sizeInBytes=10.1 MiB)

== Physical Plan ==
AdaptiveSparkPlan isFinalPlan=false
+- HashAggregate(keys=[user#880], functions=[count(1)], output=[user#880, count#883L])
"""


OPTIMIZED = "== Optimized Logical Plan ==\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (AGGREGATE, math.ceil(6.55 * 2**20)),  # the root's, not the relation's 10.1 MiB
        (OPTIMIZED + "Range (0, 10, step=1, splits=Some(2)), Statistics(sizeInBytes=80.0 B, rowCount=10)\n", 80),
        (OPTIMIZED + "Relation [a#1] json, Statistics(sizeInBytes=1.9 KiB)\n", math.ceil(1.95 * 1024)),
        (OPTIMIZED + "LocalRelation <empty>, Statistics(sizeInBytes=8.0 EiB)\n", math.ceil(8.05 * 2**60)),
        ("== Physical Plan ==\nFileScan json, Statistics(sizeInBytes=1.0 MiB)\n", None),  # not the optimized plan
        (OPTIMIZED + "Relation [a#1] json\n\n== Physical Plan ==\nStatistics(sizeInBytes=1.0 MiB)\n", None),
        ("", None),
    ],
)
def test_the_optimized_plans_root_size_rounded_up(text: str, expected: int | None) -> None:
    assert explained_bytes(text) == expected
