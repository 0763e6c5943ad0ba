"""DimensionEnrichment: NULL delete conditions, tombstones of deletes and their retention, old state.

A seeded random changelog (upserts, deletes, NULL and unknown ops, late versions, equal
versions) runs through the real protocol in-process, checkpoint by checkpoint, and the
emitted facts are compared with a pure-Python model of the documented rules.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import pandas as pd
import pytest

from airflow_provider_checkpoint.core.model import Barrier, CheckpointType
from airflow_provider_checkpoint.dataflow import DimensionEnrichment, FileSource
from airflow_provider_checkpoint.restore.requests import read_state
from airflow_provider_checkpoint.testing.inprocess import T0, make_job
from tests.spark.helpers import table
from tests.spark.orders import CUSTOMER, HOLD, ORDER, RETENTION, Landing, assert_equal, enrichment_pipeline

pytestmark = pytest.mark.spark
SEED = int(os.environ.get("ENRICHMENT_SEED", "11"))


declare = enrichment_pipeline("hold", hold_ttl=HOLD, tombstone_retention=RETENTION)


@dataclass
class Stored:
    version: int
    segment: str | None
    deleted_at: float | None  # set: a tombstone


class Model:
    """The documented rules, change by change, written independently of the operator."""

    def __init__(self) -> None:
        self.dim: dict[str, Stored] = {}
        self.held: list[tuple[dict, float]] = []
        self.out: list[dict] = []
        self.seen = {"ignored_by_tombstone": 0, "resurrected_after_retention": 0, "null_op_upsert": 0, "tie": 0}
        self.forgotten: dict[str, int] = {}  # key → version of a tombstone dropped by retention

    def checkpoint(self, now: float, orders: list[dict], changes: list[dict]) -> None:
        for key, s in list(self.dim.items()):
            if s.deleted_at is not None and s.deleted_at + RETENTION.total_seconds() <= now:
                del self.dim[key]
                self.forgotten[key] = s.version
        best: dict[str, dict] = {}
        for c in changes:
            rank = (c["updated_at"], c["op"] == "D", (c["segment"] is not None, c["segment"] or ""))
            b = best.get(c["customer_id"])
            if b is not None and b["updated_at"] == c["updated_at"]:
                self.seen["tie"] += 1
            if b is None or rank > (b["updated_at"], b["op"] == "D", (b["segment"] is not None, b["segment"] or "")):
                best[c["customer_id"]] = c
        for key, c in best.items():
            stored = self.dim.get(key)
            if stored is not None and c["updated_at"] < stored.version:
                self.seen["ignored_by_tombstone"] += stored.deleted_at is not None
                continue
            if stored is None and c["updated_at"] < self.forgotten.get(key, -1) and c["op"] != "D":
                self.seen["resurrected_after_retention"] += 1
            self.seen["null_op_upsert"] += c["op"] is None
            self.dim[key] = Stored(c["updated_at"], c["segment"], now if c["op"] == "D" else None)
        live = {k: s.segment for k, s in self.dim.items() if s.deleted_at is None}
        waiting, self.held = self.held + [(o, now) for o in orders], []
        for order, since in waiting:
            if order["customer_id"] in live:
                self.out.append({**order, "segment": live[order["customer_id"]]})
            elif since + HOLD.total_seconds() <= now:
                self.out.append({**order, "segment": None})
            else:
                self.held.append((order, since))


def random_changes(rng: random.Random, versions: dict[str, int]) -> list[dict]:
    """Changes of 8 customers: mostly new versions, some late (older) or repeated versions."""
    changes = []
    for _ in range(rng.randrange(2, 8)):
        key = f"c{rng.randrange(8)}"
        top = versions.get(key, 0)
        roll = rng.random()
        version = rng.randrange(max(top - 4, 0), top + 1) if roll < 0.3 and top else top + rng.randrange(1, 3)
        versions[key] = max(top, version)
        op = rng.choices(["U", "D", None, "X"], [5, 3, 2, 1])[0]
        segment = rng.choice(["gold", "silver", "bronze", None])
        changes.append({"customer_id": key, "segment": segment, "updated_at": version, "op": op})
    return changes


def test_random_changelog_matches_the_model(spark, tmp_path):
    job = make_job(spark, tmp_path, declare, inline_state_threshold=0)  # state in files, held rows next to others
    landing, model, rng, versions = Landing(tmp_path, seed=SEED), Model(), random.Random(SEED), {}
    for n in range(1, 13):
        landing.land(n, rng.randrange(0, 8), random_changes(rng, versions))
        job.checkpoint()
        orders, changes = landing.cuts[n]
        model.checkpoint(T0 + 100 * n, orders, changes)
    assert_equal(table(tmp_path / "marts" / "enriched"), pd.DataFrame(model.out), ["order_id"])
    assert all(model.seen.values()), f"the data must exercise every rule: {model.seen}"
    state = read_state(job.storage.url(f"chk-{job.checkpoints}"), "enrich").to_pandas()
    tombstones = state[state["_kind"] == "deleted"]
    want = {k: s.version for k, s in model.dim.items() if s.deleted_at is not None}
    assert dict(zip(tombstones["customer_id"], tombstones["updated_at"], strict=True)) == want


def test_null_delete_condition_is_an_upsert_and_old_state_loads(spark):
    """A change whose op is NULL keeps its row; state written before tombstones (no
    ``_deleted_at``) still loads, and its keys get tombstones from then on."""
    from pyspark.sql import functions as F

    orders = spark.createDataFrame([(1, "a", 10), (2, "b", 20), (3, "c", 30)], ORDER)
    customers = spark.createDataFrame([("a", "gold", 5, None), ("b", "x", 5, "D"), ("c", "new", 1, "")], CUSTOMER)
    source = FileSource("f", "/nonexistent", "json", ORDER)
    op = DimensionEnrichment(
        "e",
        source,
        FileSource("d", "/nonexistent", "csv", CUSTOMER),
        ["customer_id"],
        "updated_at",
        ["segment"],
        "op = 'D'",
    )
    old = op.initial_state(spark, {"f": orders, "d": customers}).drop("_deleted_at")
    old = old.unionByName(
        spark.createDataFrame(
            [("dim", "a", 4, "silver"), ("dim", "b", 4, "silver")],
            "_kind STRING, customer_id STRING, updated_at LONG, segment STRING",
        ),
        allowMissingColumns=True,
    )
    barrier = Barrier(1, T0, CheckpointType.CHECKPOINT, {})
    state, output = op.process({"f": orders, "d": customers}, old, barrier)
    got = output.toPandas().sort_values("order_id").reset_index(drop=True)
    want = pd.DataFrame({"order_id": [1, 2, 3], "customer_id": ["a", "b", "c"], "amount": [10, 20, 30]})
    want["segment"] = ["gold", None, "new"]
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    rows = {r["customer_id"]: (r["_kind"], r["updated_at"], r["_deleted_at"]) for r in state.collect()}
    assert rows == {"a": ("dim", 5, None), "b": ("deleted", 5, T0), "c": ("dim", 1, None)}
    assert state.columns == op.initial_state(spark, {"f": orders, "d": customers}).columns
    late = spark.createDataFrame([("b", "back", 4, "U")], CUSTOMER)
    _, output = op.process({"f": orders.where(F.col("order_id") == 2), "d": late}, state, barrier)
    assert [r["segment"] for r in output.collect()] == [None], "a late change older than the delete is ignored"
