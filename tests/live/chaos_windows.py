"""The chaos test's windowed branch: clicks with event time, out of order and late, through a
``WindowAggregate`` (2-minute tumbling windows, 3-minute watermark bound, ``emit="final"``) into an
append Parquet table, and the plain-Python model of what that table must hold.

The data keep the truth independent of how failed runs regroup landings into checkpoints and of
the restore: every on-time row is newer than any watermark a checkpoint could have reached before
it landed (the greatest event time landed so far minus the bound), and every late row's window
ended before the watermark of the first completed checkpoint, which every later checkpoint (a
restored one included) has passed. So the table must hold, once each, every window of the on-time
rows that the final watermark (greatest event time minus the bound) has closed.
"""

from __future__ import annotations

import datetime
import random
from pathlib import Path

import pandas as pd

from airflow_provider_checkpoint.testing.clickstream import land_json_lines, read_table

SIZE_S, BOUND_S, SPAN_S = 120, 180, 300  # window, watermark bound, event time a landing moves on
T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


class ChaosWindows:
    """The clicks landed for the windowed branch, and its model."""

    def __init__(self, landing: Path) -> None:
        self.landing = landing
        self.on_time: list[tuple[str, int, int]] = []  # user, event time (s from T0), amount
        self.late = 0
        self.top: int | None = None  # greatest event time landed
        self.closed: int | None = None  # greatest event time the first completed checkpoint read
        landing.mkdir(parents=True, exist_ok=True)

    def land(self, name: str, rng: random.Random) -> None:
        """A file of on-time rows in random order, with a few late ones once a checkpoint has completed."""
        low = 0 if self.top is None else self.top - BOUND_S + 1
        rows = [
            (f"u{rng.randrange(8)}", rng.randrange(low, low + BOUND_S + SPAN_S), rng.randrange(1, 100))
            for _ in range(rng.randrange(20, 60))
        ]
        self.on_time += rows
        self.top = max(ts for _, ts, _ in self.on_time)
        late = []
        if self.closed is not None:
            late = [
                (f"u{rng.randrange(8)}", self.closed - BOUND_S - SIZE_S - rng.randrange(600), 1)
                for _ in range(rng.randrange(1, 6))
            ]
            self.late += len(late)
        mixed = rows + late
        rng.shuffle(mixed)
        land_json_lines(
            self.landing,
            name,
            [{"user": u, "ts": (T0 + datetime.timedelta(seconds=ts)).isoformat(), "amount": a} for u, ts, a in mixed],
        )

    def completed(self) -> None:
        """A checkpoint completed after the last landing: it read every row landed so far."""
        if self.closed is None:
            self.closed = self.top

    def expected(self) -> list[tuple[str, int, int, int, int]]:
        """(user, window start, window end (s from T0), clicks, total) of every closed window, sorted."""
        assert self.top is not None
        windows: dict[tuple[str, int], tuple[int, int]] = {}
        for user, ts, amount in self.on_time:
            key = (user, ts - ts % SIZE_S)
            clicks, total = windows.get(key, (0, 0))
            windows[key] = (clicks + 1, total + amount)
        mark = self.top - BOUND_S
        return sorted((u, s, s + SIZE_S, c, t) for (u, s), (c, t) in windows.items() if s + SIZE_S <= mark)

    def problems(self, table: Path) -> dict[str, str]:
        got = read_table(table)
        rows = []
        if not got.empty:
            epoch = pd.Timestamp(T0)
            for c in ("window_start", "window_end"):
                got[c] = (pd.to_datetime(got[c], utc=True) - epoch) // pd.Timedelta(seconds=1)
            cols = ["user", "window_start", "window_end", "clicks", "total"]
            rows = sorted(tuple(int(v) if i else v for i, v in enumerate(r)) for r in got[cols].itertuples(index=False))
        want = self.expected()
        if rows != want:
            extra, missing = sorted(set(rows) - set(want))[:3], sorted(set(want) - set(rows))[:3]
            dupes = len(rows) - len(set(rows))
            found = f"{len(rows)} rows vs {len(want)} expected ({dupes} duplicated"
            return {"click_windows": f"{found}; extra {extra}, missing {missing})"}
        return {}
