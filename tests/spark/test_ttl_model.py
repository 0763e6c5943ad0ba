"""A Hypothesis state machine over state that expires, checked against plain Python after every checkpoint.

The pipeline: JSON files of ``(user, ts, amount)`` → three operators in one step, each into its
Parquet table:

- ``proc``: :class:`KeyedAggregate` (count, sum) with ``ttl="250 s"`` by processing time — checkpoints
  are triggered 100 s apart (:data:`~airflow_provider_checkpoint.testing.inprocess.T0`), so a key lives
  through the two checkpoints after its last update; into an upsert table;
- ``evt``: the same with ``ttl="20 minutes"`` by event time and a 5-minute watermark; into an upsert table;
- ``dedup``: :class:`Deduplicate` with ``within="15 minutes"`` (longer than the bound: no Spark
  counterpart) and the same watermark; into an append table.

Each step is a checkpoint after landing 0 to 2 files (rows around a clock that moves on by 0 to 15
minutes: up to 30 minutes before it, 5 after; no time; a null user), maybe from a restore to a
retained checkpoint (it reads again every file landed after that one, at a later trigger time).
:class:`Model` is the documented semantics (docs/event-time.md, "State that expires") in plain Python:
after every checkpoint the tables equal it, and so do the watermark, the state's rows and the rows
dropped as late or without a time. The run must have expired keys that came back, dropped
late rows, re-emitted a key after its dedup state expired, restored and written incremental state.

CI runs the fixed seed below; ``TTL_SEEDS=1,2,3``, ``TTL_EXAMPLES``, ``TTL_STEPS`` run more,
``TTL_SHRINK=0`` skips shrinking a failure.
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

import pandas as pd
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from airflow_provider_checkpoint.dataflow import TTL, Deduplicate, FileSource, KeyedAggregate, ParquetTableSink
from airflow_provider_checkpoint.restore.requests import request_restore
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore
from airflow_provider_checkpoint.testing.inprocess import T0, Job, make_job
from tests.spark.helpers import table as parquet_table
from tests.spark.sink_machine import _diff, run_machine
from tests.spark.sink_model import scratch_root

pytestmark = pytest.mark.spark

SEEDS = [int(s) for s in os.environ.get("TTL_SEEDS", "52").split(",")]
EXAMPLES = int(os.environ.get("TTL_EXAMPLES", "1"))
STEPS = int(os.environ.get("TTL_STEPS", "8"))
SHRINK = os.environ.get("TTL_SHRINK", "1") != "0"

MINUTE = 60_000
BOUND, EVENT_TTL, WITHIN, PROCESSING_TTL = 5 * MINUTE, 20 * MINUTE, 15 * MINUTE, 250_000
EPOCH_MS = int(datetime.datetime(2026, 3, 1, tzinfo=datetime.UTC).timestamp() * 1000)
Row = tuple[str | None, int | None, int]
"""``(user, ts in ms since the epoch or None, amount)``."""
Agg = tuple[int, int, int]
"""count, sum of ``amount``, expiry (ms)."""
FILES = st.integers(0, 2**32 - 1)


def declare(base: Path) -> None:
    events = FileSource("events", f"{base}/landing", "json", "user STRING, ts TIMESTAMP, amount LONG")
    aggs = {"n": "count", "total": "sum(amount)"}
    proc = KeyedAggregate("proc", events, ["user"], aggs, ttl=TTL("250 s", update="on_read_and_write"))
    ParquetTableSink("proc_out", proc, f"{base}/proc", "upsert", ["user"], step="all")
    evt = KeyedAggregate(
        "evt", events, ["user"], aggs, ttl=TTL("20 minutes", time="event"), watermark=("ts", "5 minutes")
    )
    ParquetTableSink("evt_out", evt, f"{base}/evt", "upsert", ["user"], step="all")
    dedup = Deduplicate("dedup", events, ["user"], within="15 minutes", watermark=("ts", "5 minutes"))
    ParquetTableSink("dedup_out", dedup, f"{base}/dedup", "append", step="all")


def aggregate(state: dict[str | None, Agg], rows: list[Row], read: int | None, stamp: Any, ttl: int) -> set[Any]:
    """Merge ``rows`` into ``state`` (in place): state expired at ``read`` is not read (the key restarts);
    each row renews its key's expiry to ``stamp(row) + ttl``, never shortening it. Returns the keys
    that restarted over expired state."""
    restarted = {k for k, (_, _, e) in state.items() if read is not None and e <= read and k in {r[0] for r in rows}}
    for k in [k for k, (_, _, e) in state.items() if read is not None and e <= read]:
        del state[k]
    for row in rows:
        n, total, expires = state.get(row[0], (0, 0, stamp(row) + ttl))
        state[row[0]] = (n + 1, total + row[2], max(expires, stamp(row) + ttl))
    return restarted


def kept(state: dict[Any, Any], clock: int | None, expiry: Any) -> dict[Any, Any]:
    return {k: v for k, v in state.items() if clock is None or clock < expiry(v)}


@dataclass
class Operators:
    """What the three operators hold after a checkpoint."""

    watermark: int | None = None
    top: int | None = None
    proc: dict[str | None, Agg] = field(default_factory=dict)
    evt: dict[str | None, Agg] = field(default_factory=dict)
    dedup: dict[str | None, int] = field(default_factory=dict)

    def checkpoint(self, rows: list[Row], trigger_ms: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out["restarted"] = aggregate(self.proc, rows, trigger_ms, lambda r: trigger_ms, PROCESSING_TTL)
        out["proc"] = {r[0]: self.proc[r[0]][:2] for r in rows}
        self.proc = kept(self.proc, trigger_ms, lambda v: v[2])

        timed = [r for r in rows if r[1] is not None]
        before = self.watermark
        out["restarted"] |= aggregate(self.evt, timed, before, lambda r: r[1], EVENT_TTL)
        out["evt"] = {r[0]: self.evt[r[0]][:2] for r in timed}
        if timed:
            top = max(r[1] for r in timed if r[1] is not None)
            self.top = top if self.top is None else max(self.top, top)
            self.watermark = self.top - BOUND if before is None else max(before, self.top - BOUND)
        self.evt = kept(self.evt, self.watermark, lambda v: v[2])

        live = kept(self.dedup, before, lambda e: e)
        on_time = [r for r in timed if before is None or (r[1] or 0) > before]
        out["late"], out["untimed"], out["dedup"] = len(timed) - len(on_time), 2 * (len(rows) - len(timed)), []
        for row in sorted(on_time, key=lambda r: (r[1], r[2])):
            if row[0] not in live:
                live[row[0]] = (row[1] or 0) + WITHIN
                out["dedup"].append(row)
        self.dedup = kept(live, self.watermark, lambda e: e)
        return out


@dataclass
class Model:
    files: list[list[Row]] = field(default_factory=list)
    read: int = 0
    operators: Operators = field(default_factory=Operators)
    completed: dict[int, tuple[int, Operators, list[Row]]] = field(default_factory=dict)
    """Checkpoint id → files read, operators after it, the dedup table after it (a copy: a restore to a
    checkpoint of an abandoned branch takes back that branch's rows, not a prefix of today's table)."""
    proc: dict[str | None, tuple[int, int]] = field(default_factory=dict)
    evt: dict[str | None, tuple[int, int]] = field(default_factory=dict)
    dedup: list[Row] = field(default_factory=list)
    restore: int | None = None
    last: dict[str, Any] = field(default_factory=dict)

    def checkpoint(self, checkpoint_id: int) -> None:
        if self.restore is not None:
            self.read, operators, table = self.completed[self.restore]
            self.operators, self.dedup = copy.deepcopy(operators), list(table)
            self.restore = None
        rows = [r for f in self.files[self.read :] for r in f]
        self.last = self.operators.checkpoint(rows, int((T0 + 100 * checkpoint_id) * 1000))
        self.proc.update(self.last["proc"])
        self.evt.update(self.last["evt"])
        self.dedup.extend(self.last["dedup"])
        self.read = len(self.files)
        self.completed[checkpoint_id] = (self.read, copy.deepcopy(self.operators), list(self.dedup))


def rows(path: Path, columns: list[str]) -> list[tuple[Any, ...]]:
    got = parquet_table(path)
    if got.empty:
        return []
    if "ts" in got:
        got["ts"] = pd.to_datetime(got["ts"], utc=True).dt.as_unit("ms").astype("int64")
    return sorted(
        (tuple(None if pd.isna(v) else (v if isinstance(v, str) else int(v)) for v in r) for r in got[columns].values),
        key=repr,
    )


@dataclass
class Tally:
    restarted: int = 0
    again: int = 0
    restores: int = 0
    incremental: int = 0
    late: int = 0


def machine_for(spark: Any, root: Path, tally: Tally) -> type[RuleBasedStateMachine]:
    class TtlMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.base = Path(root) / f"m{len(list(Path(root).iterdir()))}"
            (self.base / "landing").mkdir(parents=True)
            self.job: Job = make_job(spark, self.base, declare, inline_state_threshold=0)  # state in files: deltas
            self.model = Model()
            self.clock = EPOCH_MS

        def land(self, rng: random.Random) -> None:
            self.clock += rng.randrange(16) * MINUTE
            landed: list[Row] = []
            for _ in range(rng.randrange(11)):
                ts = self.clock + rng.randrange(-30, 6) * MINUTE + rng.choice((0, 30_000))
                user = rng.choice([None, *"abcdefgh"])
                landed.append((user, None if rng.randrange(15) == 0 else ts, rng.randrange(1, 10)))
            name = self.base / "landing" / f"f{len(self.model.files):04d}.json"
            lines = "".join(json.dumps({"user": u, "ts": _iso(ts), "amount": a}) + "\n" for u, ts, a in landed)
            name.with_name("." + name.name).write_text(lines)
            name.with_name("." + name.name).rename(name)
            self.model.files.append(landed)

        @rule(seed=FILES)
        def checkpoint(self, seed: int) -> None:
            """Maybe request a restore to a retained checkpoint, land 0 to 2 files (none: an empty
            checkpoint), then a checkpoint. The choices come from ``seed`` and the checkpoint's number
            (Hypothesis draws its first seeds alike)."""
            rng = random.Random(f"{seed}/{self.job.checkpoints}")
            if self.model.completed and rng.random() < 0.3:
                self.restore(rng)
            for _ in range(rng.choice((1, 1, 2, 0))):
                self.land(rng)
            checkpoint_id = self.job.checkpoints + 1
            completed = self.job.checkpoint()
            assert completed.checkpoint_id == checkpoint_id
            self.model.checkpoint(checkpoint_id)
            ops, last = self.model.operators, self.model.last
            for uid in ("evt", "dedup"):
                progress = completed.operators[uid].event_time
                assert progress is not None
                assert (progress.watermark, progress.max_event_time) == (ops.watermark, ops.top), uid
            steps = completed.stats["steps"].values()
            assert sum(s.get("late_rows_dropped", 0) for s in steps) == last["late"], "late rows"
            assert sum(s.get("rows_without_event_time", 0) for s in steps) == last["untimed"], "rows without time"
            state = {uid: completed.operators[uid].rows for uid in ("proc", "evt", "dedup")}
            assert state == {"proc": len(ops.proc), "evt": len(ops.evt), "dedup": len(ops.dedup)}, "live keys"
            tally.incremental += sum(s.get("state_incremental", 0) for s in steps)
            tally.restarted += len(last["restarted"])
            tally.late += last["late"]
            tally.again = max(tally.again, len(self.model.dedup) - len({r[0] for r in self.model.dedup}))

        def restore(self, rng: random.Random) -> None:
            storage = self.job.storage
            checkpoint_id = rng.choice(sorted(CompletedCheckpointStore(storage).completed_ids()))
            request_restore(storage, storage.url(storage.chk_dir(checkpoint_id)), False, False)
            self.model.restore = checkpoint_id
            tally.restores += 1

        @invariant()
        def tables_match_the_model(self) -> None:
            for name in ("proc", "evt"):
                expected = sorted(((k, *v) for k, v in getattr(self.model, name).items()), key=repr)
                got = rows(self.base / name, ["user", "n", "total"])
                assert got == expected, f"{name}: {_diff(got, expected)}"
            got = rows(self.base / "dedup", ["user", "ts", "amount"])
            expected = sorted(self.model.dedup, key=repr)
            assert got == expected, f"dedup: {_diff(got, expected)}"

    return TtlMachine


def _iso(ts: int | None) -> str | None:
    return None if ts is None else datetime.datetime.fromtimestamp(ts / 1000, datetime.UTC).isoformat()


@pytest.mark.parametrize("seed", SEEDS)
def test_expiring_state_matches_the_model(spark: Any, seed: int) -> None:
    tally = Tally()
    run_machine(machine_for(spark, scratch_root(), tally), seed, EXAMPLES, STEPS, SHRINK, 60)
    assert tally.restarted and tally.late and tally.again and tally.restores and tally.incremental, tally
