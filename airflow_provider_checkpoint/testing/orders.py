"""Orders and a customers changelog for the orders example, and its expected output computed with pandas.

The truth is computed over the aligned cuts: for every checkpoint, the orders and
customer changes it read. An order is enriched with its customer's segment as of the end
of the checkpoint that emits it (``hold``: the first checkpoint whose dimension has the
customer, or the one where its hold expires, with no segment).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

ORDER_COLUMNS = ["order_id", "customer_id", "amount"]
CHANGE_COLUMNS = ["customer_id", "segment", "updated_at", "op"]

Cut = tuple[list[dict[str, object]], list[dict[str, object]]]
"""What one checkpoint reads: (orders, customer changes)."""


def land_orders(directory: Path, name: str, n: int, seed: int, customers: int = 8) -> list[dict[str, object]]:
    """Write ``n`` orders as JSON Lines, atomically (hidden name, then rename); return them."""
    rng = random.Random(seed)
    rows: list[dict[str, object]] = [
        {"order_id": seed * 100_000 + i, "customer_id": f"c{rng.randrange(customers)}", "amount": rng.randrange(1, 500)}
        for i in range(n)
    ]
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{name}.inflight"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.rename(directory / name)
    return rows


def land_changes(directory: Path, name: str, changes: Sequence[tuple[str, str, int, str]]) -> list[dict[str, object]]:
    """Write customer changes ``(customer_id, segment, updated_at, op)`` as CSV, atomically; return them."""
    rows: list[dict[str, object]] = [dict(zip(CHANGE_COLUMNS, c, strict=True)) for c in changes]
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{name}.inflight"
    pd.DataFrame(rows, columns=CHANGE_COLUMNS).to_csv(tmp, index=False)
    tmp.rename(directory / name)
    return rows


def enriched(cuts: Sequence[Cut], on_missing: str, ttl_checkpoints: int = 0) -> pd.DataFrame:
    """Every order emitted after the checkpoints of ``cuts``, with the segment it was emitted with."""
    dimension: dict[str, tuple[int, str | None]] = {}
    held: list[tuple[dict[str, object], int]] = []
    out = []
    for n, (orders, changes) in enumerate(cuts, start=1):
        for c in sorted(changes, key=_precedence):  # the last of equal versions wins (documented tie-break)
            key, version = str(c["customer_id"]), int(str(c["updated_at"]))
            if key not in dimension or dimension[key][0] <= version:
                dimension[key] = (version, None if c["op"] == "D" else str(c["segment"]))
        live = {k: seg for k, (_, seg) in dimension.items() if seg is not None}
        waiting, held = held + [(o, n) for o in orders], []
        for order, since in waiting:
            if order["customer_id"] in live:
                out.append({**order, "segment": live[str(order["customer_id"])]})
            elif on_missing == "emit" or n - since >= ttl_checkpoints:
                out.append({**order, "segment": None})
            else:
                held.append((order, since))
    return pd.DataFrame(out, columns=[*ORDER_COLUMNS, "segment"])


def _precedence(change: dict[str, object]) -> tuple[int, bool, bool, str]:
    """Changes of one checkpoint in the order they apply: by version; a delete, then the greatest segment last."""
    segment = change["segment"]
    return int(str(change["updated_at"])), change["op"] == "D", segment is not None, str(segment or "")


def revenue_by_segment(enriched_orders: pd.DataFrame) -> pd.DataFrame:
    """Revenue and order count per segment (no segment is a group of its own)."""
    grouped = enriched_orders.groupby("segment", dropna=False)
    return grouped.agg(revenue=("amount", "sum"), orders=("amount", "size")).reset_index()
