"""A Hypothesis state machine over the "held rows" path, checked end to end against plain Python.

The pipeline: JSON files → ``KeyedAggregate`` by ``(user, page)`` (count, min, max, sum, max of a
string) → a Parquet and a Delta upsert sink with the same keys, which take the aggregate's rows
from the driver when its state was merged there (:mod:`~airflow_provider_checkpoint.dataflow.driver_rows`),
and a Parquet upsert sink with the keys swapped, which always goes through Spark. Small buckets,
small key-group ranges (``small_ranges``: deltas pile up and compact within a few checkpoints).

A job starts with a checkpoint of every ``(user, page)`` once (its rows placed in their buckets by
Spark: a row the driver later puts in another bucket shows as a key twice). Each step is one of:

- a checkpoint of a few landed files (messy keys: ``None`` and ``''`` in either key column,
  unicode, hot keys changed many times, empty files, absent fields), maybe with a file landed
  after the barrier, under drawn checkpoint settings (``driver_merge_rows``, inline state) so
  that the state is merged on the driver, incrementally in Spark or in a full version, and
  switches between them; maybe a savepoint; maybe with an injected fault: a step attempt that
  fails (retried), a finalize that fails before ``_metadata`` (aborted: its input is read
  again) or after it (the next trigger commits it);
- a restore request to a retained checkpoint or a savepoint committed to the sinks
  (docs/savepoints-and-restore.md).

After every step each table, read with pyarrow (Parquet), delta-rs and DuckDB (Delta), must hold
exactly one row per key and equal :class:`Model`: the aggregates of every event landed before the
barrier of the checkpoint it last committed, computed in plain Python (``None`` a key part distinct
from ``''``). Under a pending restore a failed checkpoint leaves the Delta table at the restored
checkpoint's version and the Parquet tables as they are; the next completed checkpoint converges
them all. Every completed checkpoint must also take the held rows exactly when expected (merged on
the driver, same keys, the sink's ``driver_merge_rows`` not 0), and the run must take them in a
good share of its checkpoints, so that it cannot pass vacuously.

CI runs the fixed seed below; ``HELD_ROWS_SEEDS=1,2,3``, ``HELD_ROWS_EXAMPLES`` and
``HELD_ROWS_STEPS`` run more, ``HELD_ROWS_SHRINK=0`` skips shrinking a failure and
``HELD_ROWS_SHRINK_SECONDS`` (default 60) bounds it; ``HELD_ROWS_VERBOSE=1`` makes Hypothesis verbose.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from airflow_provider_checkpoint.connectors.base.upsert_rule import UpsertRows
from airflow_provider_checkpoint.core.faults import ENV as FAULTS_ENV
from airflow_provider_checkpoint.dataflow import DeltaTableSink, FileSource, KeyedAggregate, ParquetTableSink
from airflow_provider_checkpoint.exceptions import CheckpointAborted, InjectedFault
from airflow_provider_checkpoint.restore.requests import request_restore
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore
from airflow_provider_checkpoint.testing.inprocess import Job, make_job
from tests.spark.sink_machine import _diff, run_machine
from tests.spark.sink_model import delta_rows, duckdb_delta_rows, parquet_rows, scratch_root, sort_rows

pytestmark = pytest.mark.spark

SEEDS = [int(s) for s in os.environ.get("HELD_ROWS_SEEDS", "11").split(",")]
EXAMPLES = int(os.environ.get("HELD_ROWS_EXAMPLES", "2"))
STEPS = int(os.environ.get("HELD_ROWS_STEPS", "5"))
SHRINK = os.environ.get("HELD_ROWS_SHRINK", "1") != "0"
SHRINK_SECONDS = int(os.environ.get("HELD_ROWS_SHRINK_SECONDS", "60"))

KEYS = ("user", "page")
AGGS = {"n": "count", "lo": "min(ts)", "hi": "max(ts)", "total": "sum(ts)", "tag": "max(tag)"}
COLUMNS = [*KEYS, *AGGS]
SINKS = ("parquet", "delta", "swapped")
HELD_BY = ("parquet", "delta")
"""The sinks whose keys are the aggregate's, in its order: they may take its rows from the driver."""
USERS = [None, "", "a", "A", " ", "é✓𝄞"]
PAGES = [None, "", "/p", "𝄞"]
HOT = [(None, None), ("", ""), (None, ""), ("", None), ("é✓𝄞", "𝄞")]
TAGS = [None, "", "x", "ü𝄞", "z"]
FAULTS: dict[str, str | None] = {
    "none": None,
    "step retried": "step.after_state_write:attempt=1",
    "compaction retried": "step.during_compaction:attempt=1",
    "ack retried": "step.before_ack:attempt=1",  # after the sinks staged
    "aborted": "finalize.before_metadata",
    "committed later": "finalize.after_metadata",
}
"""What happens to a checkpoint: each a ``CHECKPOINT_FAULTS`` spec (core/faults.py)."""

Event = tuple[str | None, str | None, int | None, str | None]
"""``(user, page, ts, tag)``."""
_machines = itertools.count()


def declare(base: Path, buckets: int, sink_rows: tuple[int, int, int]) -> None:
    """The pipeline; ``sink_rows``: each sink's ``driver_merge_rows``, in :data:`SINKS` order."""
    events = FileSource("events", f"{base}/landing", "json", "user STRING, page STRING, ts LONG, tag STRING")
    totals = KeyedAggregate("totals", events, keys=list(KEYS), aggs=AGGS)
    parquet, delta, swapped = sink_rows
    keys, other = list(KEYS), list(KEYS[::-1])  # another hash
    ParquetTableSink("parquet", totals, f"{base}/parquet", "upsert", keys, buckets=buckets, driver_merge_rows=parquet)
    DeltaTableSink("delta", totals, f"{base}/delta", "upsert", keys, buckets=buckets, driver_merge_rows=delta)
    ParquetTableSink("swapped", totals, f"{base}/swapped", "upsert", other, buckets=buckets, driver_merge_rows=swapped)


def aggregate(events: Iterable[Event]) -> list[tuple[Any, ...]]:
    """One row per key, in :data:`COLUMNS` order: count, then min, max and sum of the non-null ``ts``
    and max of the non-null ``tag`` (``None`` where there are none), sorted."""
    per_key: dict[tuple[str | None, str | None], list[Event]] = {}
    for e in events:
        per_key.setdefault((e[0], e[1]), []).append(e)
    rows = []
    for key, group in per_key.items():
        ts = [e[2] for e in group if e[2] is not None]
        tags = [e[3] for e in group if e[3] is not None]
        rows.append((*key, len(group), min(ts, default=None), max(ts, default=None), sum(ts) if ts else None,
                     max(tags, default=None)))  # fmt: skip
    return sort_rows(rows)


@dataclass(frozen=True)
class Batch:
    """One landed file: ``cold`` rows of keys never seen before (the state grows past the drawn
    ``driver_merge_rows``), then ``events``; ``absent_nulls``: null fields left out of the JSON."""

    cold: int
    events: list[Event]
    absent_nulls: bool


_hot = st.sampled_from(HOT)
_event = st.tuples(
    st.one_of(_hot, _hot, _hot, st.tuples(st.sampled_from(USERS), st.sampled_from(PAGES))),
    st.none() | st.integers(-9, 99),
    st.sampled_from(TAGS),
).map(lambda t: (t[0][0], t[0][1], t[1], t[2]))
batches = st.builds(Batch, st.integers(0, 30), st.lists(_event, max_size=20), st.booleans())


@dataclass(frozen=True)
class Knobs:
    """The job's checkpoint settings for one checkpoint (a redeploy may change them): state of at most
    ``driver_merge_rows`` rows is merged on the driver; state up to ``inline_state_threshold`` bytes
    is inline, and the next checkpoint writes a full version."""

    driver_merge_rows: int
    inline_state_threshold: int


knobs = st.builds(
    Knobs, st.sampled_from([5_000_000, 5_000_000, 5_000_000, 40, 0]), st.sampled_from([0, 0, 0, 0, 1 << 20])
)


@dataclass
class Tally:
    """Over a whole run: completed checkpoints, those whose state was merged on the driver, and those
    whose sinks took the held rows; ``held_by``: the sinks that took them in the current checkpoint."""

    completed: int = 0
    merged_on_driver: int = 0
    held: int = 0
    held_by: set[str] = field(default_factory=set)


@dataclass
class Env:
    """What every machine of a run shares: the Spark session, the scratch root, the tally."""

    spark: Any
    root: Path
    tally: Tally


@dataclass
class Model:
    """What each table must hold: the aggregates of the first ``shown[sink]`` landed files."""

    files: list[list[Event]] = field(default_factory=list)
    cut: dict[int, int] = field(default_factory=dict)
    """Checkpoint id → files landed before its barrier (the files a checkpoint's state covers)."""
    shown: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SINKS, 0))
    committed: set[int] = field(default_factory=set)
    """Checkpoints committed to the sinks: the restore targets."""
    uncommitted: int | None = None
    """A completed checkpoint whose finalize failed after ``_metadata``: the next trigger commits it."""
    restore: int | None = None
    """A requested restore's checkpoint, until a checkpoint takes it and writes ``_metadata`` (if that
    checkpoint's finalize dies after it, the next trigger commits the checkpoint and clears the request)."""
    next_id: int = 1

    def trigger(self) -> int:
        """The trigger: recovery commits the uncommitted checkpoint (not under a pending restore), a
        pending restore rolls the sinks back (the Delta table to the restored checkpoint's version,
        upsert Parquet tables left as they are); the barrier covers the files landed so far."""
        if self.uncommitted is not None and self.restore is None:
            self.commit(self.uncommitted)
        self.uncommitted = None
        if self.restore is not None:
            self.shown["delta"] = self.cut[self.restore]
        checkpoint_id, self.next_id = self.next_id, self.next_id + 1
        self.cut[checkpoint_id] = len(self.files)
        return checkpoint_id

    def commit(self, checkpoint_id: int) -> None:
        self.shown = dict.fromkeys(SINKS, self.cut[checkpoint_id])
        self.committed.add(checkpoint_id)

    def complete(self, checkpoint_id: int) -> None:
        self.commit(checkpoint_id)
        self.restore = None

    def expected(self, sink: str) -> list[tuple[Any, ...]]:
        return aggregate(e for f in self.files[: self.shown[sink]] for e in f)


def machine_for(env: Env) -> type[RuleBasedStateMachine]:
    class HeldRowsMachine(RuleBasedStateMachine):
        @initialize(
            buckets=st.integers(2, 4),
            sink_rows=st.tuples(st.sampled_from([1, 250_000]), *[st.sampled_from([1, 250_000, 0])] * 2),
            first=batches,
        )
        def start(self, buckets: int, sink_rows: tuple[int, int, int], first: Batch) -> None:
            """A fresh job and its first checkpoint (a full version of state, written to the tables by
            Spark) of every ``(user, page)`` once and ``first``: later events of those keys update rows
            Spark placed, so a row the driver puts in another bucket than Spark is seen twice. Each
            sink's ``driver_merge_rows``: 1 (held rows only), plenty, or 0 (Spark; not the Parquet
            sink's, so that most runs take the held rows)."""
            self.base = env.root / f"held-{next(_machines)}"
            (self.base / "landing").mkdir(parents=True)
            self.sink_rows = dict(zip(SINKS, sink_rows, strict=True))
            self.job: Job = make_job(
                env.spark, self.base, functools.partial(declare, buckets=buckets, sink_rows=sink_rows),
                inline_state_threshold=0, retained_checkpoints=3, tolerable_failed_checkpoints=1_000,
            )  # fmt: skip
            self.settings = self.job.coordinator.settings
            self.model = Model()
            self.cold = itertools.count()
            self.savepoints: dict[int, str] = {}
            every_key: list[Event] = [(u, p, 0, None) for u in USERS for p in PAGES]
            self.checkpoint([Batch(0, every_key, False), first], None, Knobs(5_000_000, 0), "none", False)

        def land(self, batch: Batch) -> None:
            """Write ``batch`` as the next landing file (JSON lines, UTF-8), complete when it appears."""
            rows = [(f"cold{i}", f"/c{i % 3}", i, "cold") for i in itertools.islice(self.cold, batch.cold)]
            events: list[Event] = rows + batch.events
            landing = self.base / "landing"
            name = f"events-{len(self.model.files):04d}.json"
            lines = []
            for e in events:
                record = dict(zip(("user", "page", "ts", "tag"), e, strict=True))
                if batch.absent_nulls:
                    record = {k: v for k, v in record.items() if v is not None}
                lines.append(json.dumps(record, ensure_ascii=False) + "\n")
            (landing / f".{name}").write_text("".join(lines), encoding="utf-8")
            (landing / f".{name}").rename(landing / name)  # complete files only: no partial read
            self.model.files.append(events)

        @rule(
            files=st.lists(batches, min_size=1, max_size=3),
            late=st.none() | batches,
            knobs=knobs,
            fault=st.sampled_from(["none", "none", *FAULTS]),
            savepoint=st.sampled_from([False, False, False, True]),
        )
        def checkpoint(self, files: list[Batch], late: Batch | None, knobs: Knobs, fault: str, savepoint: bool) -> None:
            """Land ``files``, run a checkpoint (``late`` lands after its barrier) under ``knobs``."""
            for batch in files:
                self.land(batch)
            self.job.coordinator.settings = dataclasses.replace(self.settings, **dataclasses.asdict(knobs))
            env.tally.held_by.clear()
            target = f"file://{self.base}/savepoints/sp-{self.model.next_id}" if savepoint else None
            checkpoint_id = self.model.trigger()
            spec = FAULTS[fault]
            if spec:
                os.environ[FAULTS_ENV] = spec
            during = functools.partial(self.land, late) if late else None
            try:
                completed = self.job.checkpoint(during=during, savepoint_target=target)
            except CheckpointAborted:
                assert fault == "aborted"
                return
            except InjectedFault:
                assert fault == "committed later"
                self.model.uncommitted, self.model.restore = checkpoint_id, None
                if target:
                    self.savepoints[checkpoint_id] = target
                return
            finally:
                os.environ.pop(FAULTS_ENV, None)
            assert fault not in ("aborted", "committed later"), f"{fault}: the checkpoint completed"
            assert completed.checkpoint_id == checkpoint_id
            self.model.complete(checkpoint_id)
            if target:
                self.savepoints[checkpoint_id] = target
            on_driver = any(m.get("state_merged_on_driver") for m in completed.stats["steps"].values())
            expected = {s for s in HELD_BY if self.sink_rows[s]} if on_driver else set()
            assert env.tally.held_by == expected, f"took the held rows: {sorted(env.tally.held_by)}"
            env.tally.completed += 1
            env.tally.merged_on_driver += on_driver
            env.tally.held += bool(expected)

        def targets(self) -> list[tuple[int, str]]:
            """Restore targets: the retained checkpoints and the savepoints, each committed to the sinks."""
            store = CompletedCheckpointStore(self.job.storage)
            retained = [(c, self.job.storage.url(self.job.storage.chk_dir(c))) for c in store.completed_ids()]
            found = sorted({*retained, *self.savepoints.items()})
            return [(c, url) for c, url in found if c in self.model.committed]

        @precondition(lambda self: self.model.restore is None and bool(self.model.committed))
        @rule(pick=st.integers(0, 7))
        def restore(self, pick: int) -> None:
            """Request a restore to one of :meth:`targets` (the next checkpoint takes it)."""
            targets = self.targets()
            if not targets:
                return
            checkpoint_id, url = targets[pick % len(targets)]
            request_restore(self.job.storage, url, False, False)
            self.model.restore = checkpoint_id

        @invariant()
        def tables_match_the_model(self) -> None:
            """Every reader of every table gets exactly the model's rows, no key twice."""
            readers = {
                "parquet": {"pyarrow": parquet_rows},
                "delta": {"delta-rs scan()": delta_rows, "duckdb delta_scan": duckdb_delta_rows},
                "swapped": {"pyarrow": parquet_rows},
            }
            wrong = []
            for sink, by in readers.items():
                expected = self.model.expected(sink)
                for reader, read in by.items():
                    got = read(self.base / sink, COLUMNS)
                    twice = sorted((k for k, n in Counter(r[:2] for r in got).items() if n > 1), key=repr)
                    if got != expected or twice:
                        wrong.append(f"\n  {sink} ({reader}): keys twice {twice}; {_diff(got, expected)}")
            assert not wrong, f"{len(self.model.files)} files landed, shown {self.model.shown}:{''.join(wrong)}"

    return HeldRowsMachine


@pytest.fixture
def held_by(monkeypatch: pytest.MonkeyPatch) -> Iterator[set[str]]:
    """The sinks whose :meth:`UpsertRows.held` gave rows (the held-rows path), as they call it."""
    taken: set[str] = set()
    original = UpsertRows.held

    def held(self: UpsertRows, pmod_column: str, divisor: int) -> Any:
        rows = original(self, pmod_column, divisor)
        if rows is not None:
            taken.add(self.uid)
        return rows

    monkeypatch.setattr(UpsertRows, "held", held)
    yield taken


@pytest.mark.parametrize("seed", SEEDS)
def test_held_rows_match_the_model(spark: Any, small_ranges: None, held_by: set[str], seed: int) -> None:
    """The machine from ``seed``; then at least a third of its completed checkpoints took the held rows."""
    tally = Tally(held_by=held_by)
    verbose = bool(os.environ.get("HELD_ROWS_VERBOSE"))
    run_machine(machine_for(Env(spark, scratch_root(), tally)), seed, EXAMPLES, STEPS, SHRINK, SHRINK_SECONDS, verbose)
    assert tally.held >= max(1, tally.completed // 3), tally  # not vacuous: the held rows were taken
