"""Click events for the example pipeline, and its expected output computed independently with pandas.

The ground truth is one batch computation over all input landed so far; a checkpointed
run must produce exactly the same tables, whatever failed in between.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pandas as pd
import pyarrow.dataset as ds

TABLES = ("page_views", "user_totals", "events")
KEYS = {"page_views": ["page"], "user_totals": ["user"], "events": ["ts", "user", "page"]}


def land_events(landing: Path, name: str, n: int, seed: int, users: int = 30, pages: int = 10) -> pd.DataFrame:
    """Write ``n`` events as JSON Lines, atomically (hidden name, then rename); return them."""
    rng = random.Random(seed)
    rows = [
        {"user": f"u{rng.randrange(users)}", "page": f"/p{rng.randrange(pages)}", "ts": seed * 1_000_000 + i}
        for i in range(n)
    ]
    land_json_lines(landing, name, rows)
    return pd.DataFrame(rows, columns=["user", "page", "ts"])


def land_json_lines(landing: Path, name: str, rows: list[dict[str, object]]) -> None:
    """Write ``rows`` as the JSON Lines file ``name`` in ``landing``, atomically (hidden name, then rename)."""
    landing.mkdir(parents=True, exist_ok=True)
    tmp = landing / f".{name}.inflight"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.rename(landing / name)


def expected_tables(events: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """What the three tables must contain after processing exactly ``events``."""
    views = events.groupby("page").agg(views=("ts", "size"), last_seen=("ts", "max")).reset_index()
    users = (
        events.groupby("user")
        .agg(events=("ts", "size"), first_seen=("ts", "min"), last_seen=("ts", "max"))
        .reset_index()
    )
    return {"page_views": views, "user_totals": users, "events": events}


def read_table(path: Path) -> pd.DataFrame:
    """A table as any reader sees it: pyarrow over the directory (hidden files ignored)."""
    if not path.exists():
        return pd.DataFrame()
    return ds.dataset(str(path), format="parquet").to_table().to_pandas()


def normalized(df: pd.DataFrame, table: str) -> pd.DataFrame:
    if df.empty:
        return df
    ints = {c: "int64" for c in df.columns if c not in ("user", "page")}
    return df[sorted(df.columns)].astype(ints).sort_values(KEYS[table]).reset_index(drop=True)


def mismatches(marts: Path, events: pd.DataFrame) -> dict[str, str]:
    """Table name → what differs from the ground truth; empty when every table matches."""
    out = {}
    for table, truth in expected_tables(events).items():
        got = normalized(read_table(marts / table), table)
        want = normalized(truth, table)
        try:
            pd.testing.assert_frame_equal(got, want)
        except AssertionError as e:
            out[table] = f"{len(got)} rows vs {len(want)} expected: {str(e).splitlines()[0]}"
    return out
