"""The orders pipeline the Spark tests share: two order inputs, a customers changelog, enrichment."""

from __future__ import annotations

import datetime
import random
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from airflow_provider_checkpoint.dataflow import DimensionEnrichment, FileSource, ParquetTableSink, Union
from airflow_provider_checkpoint.dataflow.multi_input import TOMBSTONE_RETENTION
from airflow_provider_checkpoint.testing.orders import enriched, land_changes
from tests.spark.helpers import write_json

ORDER = "order_id LONG, customer_id STRING, amount LONG"
CUSTOMER = "customer_id STRING, segment STRING, updated_at LONG, op STRING"
RETENTION = datetime.timedelta(seconds=250)  # checkpoints are 100 s apart: a tombstone lives 2.5 checkpoints
HOLD = datetime.timedelta(seconds=350)


def enrichment_pipeline(
    on_missing: str,
    hold_ttl: datetime.timedelta | None = None,
    tombstone_retention: datetime.timedelta = TOMBSTONE_RETENTION,
) -> Callable[[Path], None]:
    """Orders on two inputs (a union) enriched with a customers changelog, into ``enriched`` (append).

    ``hold_ttl`` defaults to 250 s when ``on_missing="hold"``.
    """
    if hold_ttl is None and on_missing == "hold":
        hold_ttl = datetime.timedelta(seconds=250)

    def declare(tmp: Path) -> None:
        a = FileSource("orders_a", str(tmp / "orders_a"), "json", ORDER)
        b = FileSource("orders_b", str(tmp / "orders_b"), "json", ORDER)
        customers = FileSource("customers", str(tmp / "customers"), "csv", CUSTOMER)
        orders = Union("orders", [a, b])
        enriched = DimensionEnrichment(
            "enrich",
            facts=orders,
            dimension=customers,
            keys=["customer_id"],
            version="updated_at",
            columns=["segment"],
            delete_when="op = 'D'",
            on_missing=on_missing,
            hold_ttl=hold_ttl,
            tombstone_retention=tombstone_retention,
        )
        ParquetTableSink("enriched", enriched, str(tmp / "marts" / "enriched"), mode="append")

    return declare


class Landing:
    """Lands orders on two inputs and a customer changelog, and remembers every aligned cut."""

    def __init__(self, tmp: Path, seed: int) -> None:
        self.tmp, self.rng, self.n = tmp, random.Random(seed), 0
        self.cuts: list[tuple[list[dict], list[dict]]] = [([], [])]  # (orders, changes) per checkpoint
        for d in ("orders_a", "orders_b", "customers"):
            (tmp / d).mkdir(parents=True, exist_ok=True)

    def land(self, cut: int, orders: int, changes: list[dict]) -> None:
        """Land into the checkpoint ``cut`` (1-based) will read."""
        while len(self.cuts) <= cut:
            self.cuts.append(([], []))
        self.n += 1
        rows = [
            {
                "order_id": self.n * 1000 + i,
                "customer_id": f"c{self.rng.randrange(8)}",
                "amount": self.rng.randrange(100),
            }
            for i in range(orders)
        ]
        half = len(rows) // 2
        write_json(self.tmp / "orders_a" / f"o{self.n}.json", rows[:half])
        write_json(self.tmp / "orders_b" / f"o{self.n}.json", rows[half:])
        land_changes(self.tmp / "customers", f"c{self.n}.csv", [tuple(c.values()) for c in changes])
        self.cuts[cut][0].extend(rows)
        self.cuts[cut][1].extend(changes)

    def truth(self, checkpoints: int, on_missing: str, ttl_checkpoints: int = 0) -> pd.DataFrame:
        cuts = self.cuts[1:] + [([], [])] * (checkpoints + 1 - len(self.cuts))
        return enriched(cuts, on_missing, ttl_checkpoints)


def changes(*rows: tuple[str, str, int, str]) -> list[dict]:
    return [{"customer_id": c, "segment": s, "updated_at": t, "op": op} for c, s, t, op in rows]


def assert_equal(got: pd.DataFrame, want: pd.DataFrame, by: list[str]) -> None:
    got = got[sorted(want.columns)].sort_values(by).reset_index(drop=True)
    want = want[sorted(want.columns)].sort_values(by).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
