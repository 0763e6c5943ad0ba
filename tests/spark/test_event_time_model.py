"""A Hypothesis state machine over event-time windows, checked against plain Python after every checkpoint.

The pipeline: JSON files of ``(user, ts, amount)`` → two :class:`WindowAggregate` operators with a
10-minute watermark: sliding 10-minute windows every 5 minutes with 5 minutes of allowed lateness,
``emit="update"`` into a Parquet upsert table (keys and window), and 5-minute-gap sessions with 3
minutes of allowed lateness, ``emit="final"`` into a Parquet append table. Allowed lateness is what
Spark has no counterpart of (the oracle test runs without it).

Each step is one of: a checkpoint (maybe a savepoint) after landing 0 to 2 files (rows around a
clock that moves on by 0 to 15 minutes, from 40 minutes before it to 5 after: on time, late within
the lateness, and very late; no time; a null user; empty files), or a restore request to a retained
checkpoint or a savepoint (the next checkpoint reads again every file landed after it).
:class:`Model` is the documented semantics (docs/event-time.md) in plain Python: after every
checkpoint both tables equal it, and so do the watermark and greatest event time in each operator's
snapshot, the numbers of rows dropped as late and without a time, and the state's rows (the open
windows: closed ones are purged). The state is in files, in small key-group ranges
(``small_ranges``): deltas pile up and compact. Incremental checkpoints merge the windows on the
driver and in Spark in turn: each path continues the state files the other wrote. The run must have
dropped late rows, met rows without a time, emitted sessions, restored, and merged incremental state
both ways.

CI runs the fixed seed below; ``EVENT_TIME_SEEDS=1,2,3``, ``EVENT_TIME_EXAMPLES``,
``EVENT_TIME_STEPS`` run more, ``EVENT_TIME_SHRINK=0`` skips shrinking a failure.
"""

from __future__ import annotations

import copy
import os
import random
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from airflow_provider_checkpoint.dataflow import FileSource, ParquetTableSink, WindowAggregate, session, sliding
from airflow_provider_checkpoint.testing.inprocess import Job, make_job
from tests.spark.event_time_machine import (
    EPOCH_MS,
    MINUTE,
    Aggs,
    Row,
    add,
    land,
    merged_sessions,
    request_restore_to,
    table,
)
from tests.spark.sink_machine import _diff, run_machine
from tests.spark.sink_model import scratch_root

pytestmark = pytest.mark.spark

SEEDS = [int(s) for s in os.environ.get("EVENT_TIME_SEEDS", "50").split(",")]
EXAMPLES = int(os.environ.get("EVENT_TIME_EXAMPLES", "1"))
STEPS = int(os.environ.get("EVENT_TIME_STEPS", "10"))
SHRINK = os.environ.get("EVENT_TIME_SHRINK", "1") != "0"

BOUND, SIZE, SLIDE, GAP = 10 * MINUTE, 10 * MINUTE, 5 * MINUTE, 5 * MINUTE
SLIDING_LATENESS, SESSION_LATENESS = 5 * MINUTE, 3 * MINUTE
FILES = st.integers(0, 2**32 - 1)
"""A checkpoint's files, drawn from a seed (rich data from the first example on, which Hypothesis draws small)."""


def declare(base: Path) -> None:
    events = FileSource("events", f"{base}/landing", "json", "user STRING, ts TIMESTAMP, amount LONG")
    aggs = {"n": "count", "total": "sum(amount)", "top": "max(amount)"}
    slides = WindowAggregate(
        "slides",
        events,
        ["user"],
        "ts",
        sliding("10 minutes", "5 minutes"),
        aggs,
        watermark=("ts", "10 minutes"),
        allowed_lateness="5 minutes",
        emit="update",
    )
    keys = ["user", "window_start", "window_end"]
    ParquetTableSink("slides_out", slides, f"{base}/slides", "upsert", keys, buckets=2, step="windows")
    sessions = WindowAggregate(
        "sessions",
        events,
        ["user"],
        "ts",
        session("5 minutes"),
        aggs,
        watermark=("ts", "10 minutes"),
        allowed_lateness="3 minutes",
    )
    ParquetTableSink("sessions_out", sessions, f"{base}/sessions", "append", step="windows")  # one step


@dataclass
class Operators:
    """What both operators hold after a checkpoint: watermark, greatest time, open windows."""

    watermark: int | None = None
    top: int | None = None
    slides: dict[tuple[str | None, int, int], Aggs] = field(default_factory=dict)
    sessions: dict[tuple[str | None, int, int], Aggs] = field(default_factory=dict)

    def checkpoint(
        self, rows: list[tuple[str | None, int, int]]
    ) -> tuple[dict[tuple[Any, ...], Aggs], list[tuple[Any, ...]], int]:
        """Advance by one checkpoint of ``rows``; returns the sliding windows updated, the sessions emitted
        and how many rows each operator dropped whole (none of their windows open), summed."""
        before = self.watermark

        def late(end: int, lateness: int) -> bool:
            return before is not None and end + lateness <= before

        touched = set()
        dropped = sum(
            late(ts - ts % SLIDE + SIZE, SLIDING_LATENESS) + late(ts + GAP, SESSION_LATENESS) for _, ts, _ in rows
        )
        for user, ts, amount in rows:
            start = ts - ts % SLIDE
            while start + SIZE > ts:
                key = (user, start, start + SIZE)
                if not late(start + SIZE, SLIDING_LATENESS):
                    self.slides[key] = add(self.slides.get(key), amount)
                    touched.add(key)
                start -= SLIDE
        for user, ts, amount in rows:
            if not late(ts + GAP, SESSION_LATENESS):
                self.sessions = merged_sessions(self.sessions, (user, ts, ts + GAP), (1, amount, amount))
        if rows:
            self.top = max(ts for _, ts, _ in rows) if self.top is None else max(self.top, *(r[1] for r in rows))
            self.watermark = self.top - BOUND if before is None else max(before, self.top - BOUND)
        updated = {k: self.slides[k] for k in touched}
        emitted = []
        after = self.watermark
        if after is not None:
            self.slides = {k: v for k, v in self.slides.items() if k[2] + SLIDING_LATENESS > after}
            emitted = [(*k, *v) for k, v in self.sessions.items() if k[2] + SESSION_LATENESS <= after]
            self.sessions = {k: v for k, v in self.sessions.items() if k[2] + SESSION_LATENESS > after}
        return updated, emitted, dropped


@dataclass
class Model:
    """The files, what each completed checkpoint had read and held, and what the tables hold."""

    files: list[list[Row]] = field(default_factory=list)
    read: int = 0
    operators: Operators = field(default_factory=Operators)
    completed: dict[int, tuple[int, Operators, list[tuple[Any, ...]]]] = field(default_factory=dict)
    """Checkpoint id → files read, operators after it, the sessions table after it (a copy: a restore
    to a checkpoint of an abandoned branch takes back that branch's rows, not a prefix of today's)."""
    slides: dict[tuple[Any, ...], Aggs] = field(default_factory=dict)
    sessions: list[tuple[Any, ...]] = field(default_factory=list)
    restore: int | None = None
    dropped: int = 0
    """Rows dropped whole by the last checkpoint as late, both operators summed."""
    untimed: int = 0
    """Rows without event time in the last checkpoint, both operators summed."""

    def checkpoint(self, checkpoint_id: int) -> None:
        if self.restore is not None:
            self.read, operators, table = self.completed[self.restore]
            self.operators, self.sessions = copy.deepcopy(operators), list(table)
            self.restore = None
        rows = [r for f in self.files[self.read :] for r in f]
        timed = [(user, ts, amount) for user, ts, amount in rows if ts is not None]
        updated, emitted, self.dropped = self.operators.checkpoint(timed)
        self.untimed = 2 * (len(rows) - len(timed))
        self.slides.update(updated)
        self.sessions.extend(emitted)
        self.read = len(self.files)
        self.completed[checkpoint_id] = (self.read, copy.deepcopy(self.operators), list(self.sessions))


@dataclass
class Tally:
    """What the runs exercised, so that the test cannot pass vacuously."""

    late: int = 0
    sessions: int = 0
    restores: int = 0
    incremental: int = 0
    untimed: int = 0
    least_ends: int = 0
    """State files whose handle's least window end was checked against the file."""
    driver_merges: int = 0
    spark_merges: int = 0
    """Incremental checkpoints of an operator merged on the driver, and in Spark."""


UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _check_least_ends(job: Job, handles: Any) -> int:
    """Each state file's handle records the least window end of its live rows (µs), read here from the file."""
    import pyarrow.parquet as pq

    for handle in handles:
        rows = pq.read_table(job.storage.path(handle.path)).to_pylist()
        ends = [r["window_end"] for r in rows if not r.get("__deleted")]  # Spark's INT96 times read back naive
        micros = [(e if e.tzinfo else e.replace(tzinfo=UTC)) - UNIX_EPOCH for e in ends]
        assert handle.least_end == min((m // timedelta(microseconds=1) for m in micros), default=2**63 - 1), handle
    return len(handles)


def machine_for(spark: Any, root: Path, tally: Tally) -> type[RuleBasedStateMachine]:
    class EventTimeMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.base = Path(root) / f"m{len(list(Path(root).iterdir()))}"
            self.base.mkdir()
            (self.base / "landing").mkdir()
            self.job: Job = make_job(spark, self.base, declare, inline_state_threshold=0)  # state in files: deltas
            self.settings = self.job.coordinator.settings
            self.spark_merge = False  # flips after every incremental checkpoint
            self.model = Model()
            self.clock = EPOCH_MS
            self.savepoints: dict[int, str] = {}

        def land(self, rng: random.Random) -> None:
            """A file of up to 10 rows around the clock, which moves on by 0 to 15 minutes: up to 40 minutes
            before it, 5 after, or none; a null user; an amount (odd: half a minute later, so that windows and
            sessions both touch and miss)."""
            self.clock += rng.randrange(16) * MINUTE
            rows = []
            for _ in range(rng.randrange(11)):
                amount = rng.randrange(1, 10)
                ts = self.clock + rng.randrange(-40, 6) * MINUTE + 30_000 * (amount % 2)
                rows.append((rng.choice([None, "a", "b"]), None if rng.randrange(15) == 0 else ts, amount))
            land(self.base / "landing" / f"f{len(self.model.files):04d}.json", rows)
            self.model.files.append(rows)

        @rule(seed=FILES, savepoint=st.booleans())
        def checkpoint(self, seed: int, savepoint: bool) -> None:
            """Land 0 to 2 files (none: an empty checkpoint), then a checkpoint, maybe a savepoint."""
            rng = random.Random(f"{seed}/{self.job.checkpoints}")  # Hypothesis draws many seeds the same
            for _ in range((1, 1, 2, 0)[seed % 4]):
                self.land(rng)
            spark_merge = self.spark_merge  # else on the driver: each continues the other's state files
            self.job.coordinator.settings = replace(self.settings, driver_merge_rows=0 if spark_merge else 10**6)
            checkpoint_id = self.job.checkpoints + 1
            target = f"file://{self.base}/savepoints/sp-{checkpoint_id}" if savepoint else None
            completed = self.job.checkpoint(savepoint_target=target)
            assert completed.checkpoint_id == checkpoint_id
            self.model.checkpoint(checkpoint_id)
            if target:
                self.savepoints[checkpoint_id] = target
            for uid in ("slides", "sessions"):
                tally.least_ends += _check_least_ends(self.job, completed.operators[uid].handles)
                progress = completed.operators[uid].event_time
                assert progress is not None
                assert (progress.watermark, progress.max_event_time) == (
                    self.model.operators.watermark,
                    self.model.operators.top,
                ), uid
            steps = completed.stats["steps"].values()
            dropped = sum(s.get("late_rows_dropped", 0) for s in steps)
            assert dropped == self.model.dropped, "late rows dropped"
            untimed = sum(s.get("rows_without_event_time", 0) for s in steps)
            assert untimed == self.model.untimed, "rows without event time"
            tally.untimed += untimed
            open_windows = len(self.model.operators.slides) + len(self.model.operators.sessions)
            assert sum(s["state_rows"] for s in steps) == open_windows, "state rows: the open windows"
            tally.incremental += sum(s.get("state_incremental", 0) for s in steps)
            tally.driver_merges += sum(s.get("state_merged_on_driver", 0) for s in steps)
            tally.spark_merges += sum(s.get("state_incremental", 0) for s in steps) if spark_merge else 0
            self.spark_merge ^= any(s.get("state_incremental") for s in steps)
            tally.late += dropped
            tally.sessions = max(tally.sessions, len(self.model.sessions))

        @precondition(lambda self: self.model.restore is None and bool(self.model.completed))
        @rule(pick=st.integers(0, 7))
        def restore(self, pick: int) -> None:
            self.model.restore = request_restore_to(self.job, self.savepoints, pick)
            tally.restores += 1

        @invariant()
        def tables_match_the_model(self) -> None:
            if self.model.restore is not None:  # the tables change with the next checkpoint
                return
            slides = sorted(((*k, *v) for k, v in self.model.slides.items()), key=repr)
            got = table(self.base / "slides")
            assert got == slides, f"slides: {_diff(got, slides)}"
            got = table(self.base / "sessions")
            sessions = sorted(self.model.sessions, key=repr)
            assert got == sessions, f"sessions: {_diff(got, sessions)}"

    return EventTimeMachine


@pytest.mark.parametrize("seed", SEEDS)
def test_windows_match_the_model(spark: Any, small_ranges: None, seed: int) -> None:
    tally = Tally()
    run_machine(machine_for(spark, scratch_root(), tally), seed, EXAMPLES, STEPS, SHRINK, 60)
    assert tally.late and tally.sessions and tally.restores and tally.incremental and tally.untimed, tally
    assert tally.least_ends and tally.driver_merges and tally.spark_merges, tally  # not vacuous
