"""``IntervalJoin`` on event time against a plain-Python model of docs/event-time.md's rules.

Two streams with per-input bounds of out-of-orderness (the sources' ``watermark=``), disorder, late
rows, rows without time, null keys, a side that falls silent (``idle_after``), and a restore to an
earlier checkpoint that replays the rest at once. After every checkpoint the pairs in the sink, the
watermark in the snapshot and the rows kept in state equal the model's. The model implements the
documented rule itself (per-input watermarks, the minimum over inputs not idle, lateness at or before
the watermark before the checkpoint, expiry at or before the one after); it calls no provider code.
"""

from __future__ import annotations

import datetime
import random
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_checkpoint.dataflow import FileSource, IntervalJoin, ParquetTableSink
from airflow_provider_checkpoint.restore.requests import request_restore
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore
from airflow_provider_checkpoint.testing.inprocess import T0, make_job
from tests.spark.helpers import table, write_json

pytestmark = pytest.mark.spark

BOUND = {"clicks": 120_000, "buys": 60_000}  # ms, the sources' watermarks
LOWER, UPPER = -60_000, 300_000  # "-1 minute", "5 minutes"
IDLE = 150_000  # idle_after, ms of barrier time (checkpoints are 100 s apart)
EVENT_T0 = 1_700_000_000_000  # ms
Row = tuple[str | None, int | None, Any]  # key, event time (ms), payload


def declare(base: Path) -> None:
    clicks = FileSource(
        "clicks",
        f"{base}/clicks",
        "json",
        "user STRING, click_ts TIMESTAMP, ad STRING",
        watermark=("click_ts", "2 minutes"),
    )
    buys = FileSource(
        "buys", f"{base}/buys", "json", "user STRING, buy_ts TIMESTAMP, amount LONG", watermark=("buy_ts", "1 minute")
    )
    joined = IntervalJoin(
        "joined", clicks, buys, ["user"], "click_ts", "buy_ts", "-1 minute", "5 minutes", idle_after="150 s"
    )
    ParquetTableSink("pairs", joined, f"{base}/pairs", "append")


@dataclass
class Model:
    """The documented rule, by hand: per input (greatest time, watermark, last barrier time with rows)."""

    inputs: dict[str, tuple[int | None, int | None, int]] = field(default_factory=dict)
    mark: int | None = None
    left: list[Row] = field(default_factory=list)
    right: list[Row] = field(default_factory=list)
    pairs: Counter[tuple[Any, ...]] = field(default_factory=Counter)
    late: int = 0

    def copy(self) -> Model:
        return replace(
            self, inputs=dict(self.inputs), left=list(self.left), right=list(self.right), pairs=Counter(self.pairs)
        )

    def step(self, rows: dict[str, list[Row]], now: int) -> None:
        before = self.mark
        timed = {uid: [t for _, t, _ in got if t is not None] for uid, got in rows.items()}
        for uid, times in timed.items():
            top, mark, active = self.inputs.get(uid, (None, None, now))
            if times:
                top = max(times) if top is None else max(top, max(times))
                mark = top - BOUND[uid] if mark is None else max(mark, top - BOUND[uid])
                active = now
            self.inputs[uid] = (top, mark, active)
        awake = [m for uid, (_, m, active) in self.inputs.items() if timed[uid] or now - active < IDLE]
        if awake and None not in awake:
            low = min(m for m in awake if m is not None)
            self.mark = low if self.mark is None else max(self.mark, low)
        timely = {
            uid: [r for r in got if r[1] is not None and (before is None or r[1] > before)] for uid, got in rows.items()
        }
        self.late += sum(
            1 for got in rows.values() for r in got if r[1] is not None and before is not None and r[1] <= before
        )
        new_l, new_r = timely["clicks"], timely["buys"]
        for ls, rs in ((new_l, self.right + new_r), (self.left, new_r)):
            for lk, lt, ad in ls:
                for rk, rt, amount in rs:
                    if lk == rk and lt + LOWER <= rt <= lt + UPPER:  # type: ignore[operator]
                        self.pairs[(lk, lt, ad, rt, amount)] += 1
        self.left += new_l
        self.right += new_r
        if self.mark is not None:
            self.left = [r for r in self.left if r[1] + UPPER > self.mark]  # type: ignore[operator]
            self.right = [r for r in self.right if r[1] - LOWER > self.mark]  # type: ignore[operator]


def increment(n: int, rng: random.Random, silent: bool) -> dict[str, list[Row]]:
    """Checkpoint ``n``'s rows: a minute of event time each (most on 10-second marks), 30% up to 100 s
    out of order, 8% ten minutes late, 4% without time, keys from five users and null."""

    def rows(count: int, payload: Any) -> list[Row]:
        out: list[Row] = []
        for i in range(count):
            coarse = rng.random() < 0.8  # on 10-second marks: rows meet the bounds and the watermark exactly
            t = EVENT_T0 + 60_000 * n + (10_000 * rng.randrange(6) if coarse else rng.randrange(60_000))
            t -= (10_000 * rng.randrange(10) if coarse else rng.randrange(100_000)) if rng.random() < 0.3 else 0
            t -= 600_000 if rng.random() < 0.08 else 0
            user = None if rng.random() < 0.1 else f"u{rng.randrange(5)}"
            out.append((user, None if rng.random() < 0.04 else t, payload(i)))
        return out

    return {"clicks": rows(14, lambda i: f"a{n}-{i}"), "buys": [] if silent else rows(10, lambda i: 100 * n + i)}


def land(base: Path, n: int, rows: dict[str, list[Row]]) -> None:
    def iso(t: int | None) -> str | None:
        return None if t is None else datetime.datetime.fromtimestamp(t / 1000, datetime.UTC).isoformat()

    write_json(base / "clicks" / f"c{n}.json", [{"user": u, "click_ts": iso(t), "ad": a} for u, t, a in rows["clicks"]])
    write_json(base / "buys" / f"b{n}.json", [{"user": u, "buy_ts": iso(t), "amount": a} for u, t, a in rows["buys"]])


def got_pairs(base: Path) -> Counter[tuple[Any, ...]]:
    if not (base / "pairs").exists():
        return Counter()
    got = table(base / "pairs")

    def ms(value: Any) -> int:
        return int(value.value // 1_000_000)

    return Counter(
        (None if isinstance(u, float) else u, ms(c), a, ms(b), int(m))
        for u, c, a, b, m in got[["user", "click_ts", "ad", "buy_ts", "amount"]].itertuples(index=False, name=None)
    )


def test_interval_join_on_event_time_matches_the_model(spark: Any, tmp_path: Path) -> None:
    for side in ("clicks", "buys"):
        (tmp_path / side).mkdir()
    job = make_job(spark, tmp_path, declare)
    rng, model, saved = random.Random(61), Model(), dict[int, Model]()
    landed: dict[int, dict[str, list[Row]]] = {}
    silent = {4, 5, 6}  # buys fall silent: after 150 s of barrier time the watermark follows clicks alone
    for n in range(1, 10):
        if n == 8:  # back to checkpoint 3; the next one replays increments 4-8 at once
            request_restore(job.storage, job.storage.url("chk-3"), False, False)
            model = saved[3].copy()
        landed[n] = increment(n, rng, n in silent)
        land(tmp_path, n, landed[n])
        replay = range(4, 9) if n == 8 else [n]
        rows = {uid: [r for k in replay for r in landed[k][uid]] for uid in ("clicks", "buys")}
        completed = job.checkpoint()
        model.step(rows, round((T0 + 100 * job.checkpoints) * 1000))
        checkpoint = completed.checkpoint_id
        saved[checkpoint] = model.copy()
        progress = completed.operators["joined"].event_time
        assert progress is not None and progress.watermark == model.mark, f"watermark after increment {n}"
        assert got_pairs(tmp_path) == model.pairs, f"pairs after increment {n}"
        rows_kept = CompletedCheckpointStore(job.storage).load(checkpoint).operators["joined"].rows
        assert rows_kept == len(model.left) + len(model.right), f"rows in state after increment {n}"
    assert model.late and sum(model.pairs.values()) > 20, "the data must hold late rows and pairs"
    assert any(k is None for k, *_ in model.pairs), "null keys pair with null keys"
