"""A Hypothesis state machine over :class:`KeyedProcess`, checked against plain Python after every checkpoint.

The pipeline: JSON files of ``(user, ts, amount)`` → a :class:`KeyedProcess` by ``user`` with a
10-minute watermark running :class:`Silence` → a Parquet append table. :class:`Silence` uses
every part: a value state (``count``, ``last``), a list state with an event-time TTL, a map state with
a processing-time TTL refreshed on read and write, an event-time timer (the key fell silent for 5
minutes by event time, moved on every row) and a processing-time timer (a tick 150 s of trigger time
after a checkpoint with rows; checkpoints here are 100 s apart).

Steps: checkpoints after landing 0 to 2 files (disorder, late rows, rows without a time, null users,
empty checkpoints), restores to a retained checkpoint or a savepoint. State is in files in small
key-group ranges (``small_ranges``): ranges split as keys come (the key groups are read into other
ranges: rescaling), deltas pile up and compact. :class:`Model` is the documented semantics
(docs/event-time.md, "Timers") written out by hand, not through the code under test: after every
checkpoint the table and the number of keys with state equal it.

CI runs the fixed seed below; ``KEYED_PROCESS_SEEDS=1,2,3``, ``KEYED_PROCESS_EXAMPLES``,
``KEYED_PROCESS_STEPS`` run more.
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from airflow_provider_checkpoint import TTL, KeyedProcess, KeyedProcessFunction, ListState, MapState, ValueState
from airflow_provider_checkpoint.dataflow import FileSource, ParquetTableSink
from airflow_provider_checkpoint.restore.requests import request_restore
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore
from airflow_provider_checkpoint.testing.inprocess import T0, Job, make_job
from tests.spark.helpers import table as parquet_table
from tests.spark.sink_machine import _diff, run_machine
from tests.spark.sink_model import scratch_root

pytestmark = pytest.mark.spark

SEEDS = [int(s) for s in os.environ.get("KEYED_PROCESS_SEEDS", "7").split(",")]
EXAMPLES = int(os.environ.get("KEYED_PROCESS_EXAMPLES", "1"))
STEPS = int(os.environ.get("KEYED_PROCESS_STEPS", "8"))

MINUTE = 60_000
BOUND, SILENCE, TICK = 10 * MINUTE, 5 * MINUTE, 150_000
LIST_TTL, MAP_TTL = 20 * MINUTE, 250_000
EPOCH_MS = int(datetime.datetime(2026, 3, 1, tzinfo=datetime.UTC).timestamp() * 1000)
Out = tuple[str, str | None, int, int, int]


class Silence(KeyedProcessFunction):
    output_schema = "what STRING, user STRING, at LONG, n LONG, total LONG"
    states = (
        ValueState("count", "long"),
        ValueState("last", "timestamp"),
        ListState("recent", "long", ttl=TTL("20 minutes", time="event")),
        MapState("amounts", "long", "long", ttl=TTL("250 s", update="on_read_and_write")),
    )

    def process(self, key: Any, rows: Any, ctx: Any) -> Any:
        count, last, recent, amounts = (ctx.state(n) for n in ("count", "last", "recent", "amounts"))
        if last.exists():
            ctx.delete_event_time_timer(last.get() + datetime.timedelta(milliseconds=SILENCE))
        newest = rows["ts"].max().to_pydatetime()
        if last.exists():
            newest = max(newest, last.get())
        last.update(newest)
        ctx.register_event_time_timer(newest + datetime.timedelta(milliseconds=SILENCE))
        count.update((count.get() or 0) + len(rows))
        recent.extend(int(a) for a in rows["amount"])
        for a in rows["amount"]:
            amounts.put(int(a) % 3, amounts.get(int(a) % 3, 0) + 1)
        ctx.register_processing_time_timer(ctx.processing_time + TICK)

    def on_timer(self, key: Any, timer: Any, ctx: Any) -> Any:
        count, recent, amounts = ctx.state("count"), ctx.state("recent"), ctx.state("amounts")
        total = sum(recent.get()) + sum(v for _, v in amounts.items())
        yield {"what": timer.kind, "user": key[0], "at": timer.timestamp, "n": count.get() or 0, "total": total}
        if timer.kind == "event_time":
            count.clear()
            ctx.state("last").clear()


def declare(base: Path) -> None:
    events = FileSource("events", f"{base}/landing", "json", "user STRING, ts TIMESTAMP, amount LONG")
    alerts = KeyedProcess("silence", events, ["user"], Silence(), watermark=("ts", "10 minutes"))
    ParquetTableSink("alerts_out", alerts, f"{base}/alerts", "append")


@dataclass
class Key:
    """One user's state, as the docs describe it: entries with expiries, timers."""

    count: int | None = None
    last: int | None = None
    recent: list[tuple[int, int]] = field(default_factory=list)  # (amount, expiry by event time)
    amounts: dict[int, tuple[int, int]] = field(default_factory=dict)  # bucket → (count, expiry by trigger time)
    timers: set[tuple[int, str]] = field(default_factory=set)

    def empty(self) -> bool:
        return self.count is None and self.last is None and not self.recent and not self.amounts and not self.timers


@dataclass
class Operator:
    expired: int = 0
    watermark: int | None = None
    top: int | None = None
    keys: dict[str | None, Key] = field(default_factory=dict)

    def checkpoint(self, rows: list[tuple[str | None, int, int]], now: int) -> list[Out]:
        """The rows emitted by checkpoint ``now``; :attr:`expired`: the state entries its TTLs dropped."""
        self.expired = 0
        before = self.watermark
        if rows:
            self.top = max(max(ts for _, ts, _ in rows), self.top if self.top is not None else -(10**18))
            self.watermark = self.top - BOUND if before is None else max(before, self.top - BOUND)
        after = self.watermark
        out: list[Out] = []
        for user in sorted(set(self.keys) | {u for u, _, _ in rows}, key=repr):
            key = self.keys.setdefault(user, Key())
            mine = sorted(((ts, a) for u, ts, a in rows if u == user))
            self._drop_recent(key, after)
            live = {b: v for b, v in key.amounts.items() if v[1] > now}
            self.expired += len(key.amounts) - len(live)
            key.amounts = live
            if mine:
                if key.last is not None:
                    key.timers.discard((key.last + SILENCE, "event_time"))
                key.last = max(mine[-1][0], key.last if key.last is not None else mine[-1][0])
                key.timers.add((key.last + SILENCE, "event_time"))
                key.count = (key.count or 0) + len(mine)
                assert after is not None
                key.recent += [(a, after + LIST_TTL) for _, a in mine]
                for _, a in mine:  # a read refreshes the whole map's expiries, then the put writes one
                    key.amounts = {b: (c, now + MAP_TTL) for b, (c, _) in key.amounts.items()}
                    key.amounts[a % 3] = (key.amounts.get(a % 3, (0, 0))[0] + 1, now + MAP_TTL)
                key.timers.add((now + TICK, "processing_time"))
            while due := [t for t in key.timers if t[0] <= (now if t[1] == "processing_time" else _or(after))]:
                timer = min(due, key=lambda t: (t[0], t[1] != "event_time"))
                key.timers.discard(timer)
                key.amounts = {b: (c, now + MAP_TTL) for b, (c, _) in key.amounts.items()}  # read: refreshed
                total = sum(a for a, _ in key.recent) + sum(c for c, _ in key.amounts.values())
                out.append((timer[1], user, timer[0], key.count or 0, total))
                if timer[1] == "event_time":
                    key.count = key.last = None
            self._drop_recent(key, after)
            if key.empty():
                del self.keys[user]
        return out

    def _drop_recent(self, key: Key, after: int | None) -> None:
        live = [(a, e) for a, e in key.recent if after is None or e > after]
        self.expired += len(key.recent) - len(live)
        key.recent = live


def _or(watermark: int | None) -> int:
    return -(10**18) if watermark is None else watermark


@dataclass
class Model:
    files: list[list[tuple[str | None, int | None, int]]] = field(default_factory=list)
    read: int = 0
    operator: Operator = field(default_factory=Operator)
    completed: dict[int, tuple[int, Operator, list[Out]]] = field(default_factory=dict)
    alerts: list[Out] = field(default_factory=list)
    restore: int | None = None
    fired: int = 0  # timers fired by the last checkpoint: every alert is a timer's

    def checkpoint(self, checkpoint_id: int, now: int) -> None:
        if self.restore is not None:
            self.read, operator, table = self.completed[self.restore]
            self.operator, self.alerts = copy.deepcopy(operator), list(table)
            self.restore = None
        rows = [(u, ts, a) for f in self.files[self.read :] for u, ts, a in f if ts is not None]
        out = self.operator.checkpoint(rows, now)
        self.alerts += out
        self.fired = len(out)
        self.read = len(self.files)
        self.completed[checkpoint_id] = (self.read, copy.deepcopy(self.operator), list(self.alerts))


@dataclass
class Tally:
    event: int = 0
    processing: int = 0
    restores: int = 0
    expired: int = 0


def machine_for(spark: Any, root: Path, tally: Tally) -> type[RuleBasedStateMachine]:
    class KeyedProcessMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.base = Path(root) / f"m{len(list(Path(root).iterdir()))}"
            (self.base / "landing").mkdir(parents=True)
            self.job: Job = make_job(spark, self.base, declare, inline_state_threshold=0)
            self.model = Model()
            self.clock = EPOCH_MS
            self.savepoints: dict[int, str] = {}

        def land(self, rng: random.Random) -> None:
            self.clock += rng.randrange(16) * MINUTE
            rows = []
            for _ in range(rng.randrange(8)):
                ts = self.clock + rng.randrange(-25, 4) * MINUTE
                rows.append(
                    (
                        rng.choice([None, "a", "a", "b", "b", "c"]),
                        None if rng.randrange(12) == 0 else ts,
                        rng.randrange(9),
                    )
                )
            name = self.base / "landing" / f"f{len(self.model.files):04d}.json"
            hidden = name.with_name("." + name.name)
            hidden.write_text("".join(json.dumps({"user": u, "ts": _iso(ts), "amount": a}) + "\n" for u, ts, a in rows))
            hidden.rename(name)
            self.model.files.append(rows)

        @rule(seed=st.integers(0, 2**32 - 1), savepoint=st.booleans())
        def checkpoint(self, seed: int, savepoint: bool) -> None:
            rng = random.Random(f"{seed}/{self.job.checkpoints}")
            for _ in range((1, 1, 2, 0)[seed % 4]):
                self.land(rng)
            checkpoint_id = self.job.checkpoints + 1
            target = f"file://{self.base}/savepoints/sp-{checkpoint_id}" if savepoint and seed % 3 == 0 else None
            completed = self.job.checkpoint(savepoint_target=target)
            assert completed.checkpoint_id == checkpoint_id
            self.model.checkpoint(checkpoint_id, int((T0 + 100 * checkpoint_id) * 1000))
            if target:
                self.savepoints[checkpoint_id] = target
            progress = completed.operators["silence"].event_time
            assert progress is not None and progress.watermark == self.model.operator.watermark
            steps = completed.stats["steps"].values()
            assert sum(s["state_rows"] for s in steps) == len(self.model.operator.keys), "keys with state"
            assert sum(s.get("timers_fired", 0) for s in steps) == self.model.fired, "timers fired"
            assert sum(s.get("state_entries_expired", 0) for s in steps) == self.model.operator.expired, "expired"
            tally.expired += self.model.operator.expired
            tally.event = max(tally.event, sum(a[0] == "event_time" for a in self.model.alerts))
            tally.processing = max(tally.processing, sum(a[0] == "processing_time" for a in self.model.alerts))

        @precondition(lambda self: self.model.restore is None and bool(self.model.completed))
        @rule(pick=st.integers(0, 7))
        def restore(self, pick: int) -> None:
            store = CompletedCheckpointStore(self.job.storage)
            retained = {c: self.job.storage.url(self.job.storage.chk_dir(c)) for c in store.completed_ids()}
            points = sorted({**retained, **self.savepoints}.items())  # a savepoint is also a checkpoint id
            checkpoint_id, url = points[pick % len(points)]
            request_restore(self.job.storage, url, False, False)
            self.model.restore = checkpoint_id
            tally.restores += 1

        @invariant()
        def table_matches_the_model(self) -> None:
            if self.model.restore is not None:
                return
            got = parquet_table(self.base / "alerts")
            rows = (
                [] if got.empty else list(got[["what", "user", "at", "n", "total"]].itertuples(index=False, name=None))
            )
            got_rows = sorted(((w, None if u != u or u is None else u, *map(int, r)) for w, u, *r in rows), key=repr)
            want = sorted(self.model.alerts, key=repr)
            assert got_rows == want, f"alerts: {_diff(got_rows, want)}"

    return KeyedProcessMachine


def _iso(ts: int | None) -> str | None:
    return None if ts is None else datetime.datetime.fromtimestamp(ts / 1000, datetime.UTC).isoformat()


@pytest.mark.parametrize("seed", SEEDS)
def test_keyed_process_matches_the_model(spark: Any, small_ranges: None, seed: int) -> None:
    tally = Tally()
    run_machine(machine_for(spark, scratch_root(), tally), seed, EXAMPLES, STEPS, True, 60)
    assert tally.event and tally.processing and tally.restores and tally.expired, tally  # not vacuous


class Idle(KeyedProcessFunction):
    """Processing time only (no watermark): a row per key when no row came for 150 s of trigger time."""

    output_schema = "user STRING, quiet_at LONG, n LONG"
    states = (ValueState("n", "long", ttl="10 minutes"),)

    def process(self, key: Any, rows: Any, ctx: Any) -> Any:
        for timer in ctx.timers():
            ctx.delete_processing_time_timer(timer.timestamp)
        ctx.register_processing_time_timer(ctx.processing_time + TICK)
        ctx.state("n").update((ctx.state("n").get() or 0) + len(rows))

    def on_timer(self, key: Any, timer: Any, ctx: Any) -> Any:
        return [(key[0], timer.timestamp, ctx.state("n").get())]


def test_processing_time_timers_fire_by_trigger_time_without_a_watermark(spark: Any) -> None:
    base = scratch_root()

    def declare_idle(base: Path) -> None:
        events = FileSource("events", f"{base}/landing", "json", "user STRING, amount LONG")
        ParquetTableSink("out", KeyedProcess("idle", events, ["user"], Idle()), f"{base}/out", "append")

    (base / "landing").mkdir()
    job = make_job(spark, base, declare_idle, inline_state_threshold=0)
    landed = {1: ["a", "b"], 2: ["a"], 3: [], 4: []}  # checkpoint → users with a row in it
    for checkpoint_id, users in landed.items():
        (base / "landing" / f"f{checkpoint_id}.json").write_text(
            "".join(json.dumps({"user": u, "amount": 1}) + "\n" for u in users)
        )
        completed = job.checkpoint()
        assert completed.operators["idle"].event_time is None  # no watermark, none recorded
    got = parquet_table(base / "out")
    rows = sorted(zip(got["user"], got["quiet_at"], got["n"], strict=True))
    ms = [int((T0 + 100 * c) * 1000) for c in range(5)]
    # b: last row at checkpoint 1, quiet from 1 + 150 s: fires at checkpoint 3 (trigger 300 s >= 250 s);
    # a: moved on at checkpoint 2 to 2 + 150 s: fires at 4, with the count of both its rows
    assert rows == [("a", ms[2] + TICK, 2), ("b", ms[1] + TICK, 1)]
