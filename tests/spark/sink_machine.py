"""A Hypothesis state machine driving one sink through seeded keyed change streams, faults and
restores, checking every table against :class:`~tests.spark.sink_model.Model` after each step.

Used by ``tests/spark/test_sink_model.py`` (a fixed handful of seeds) and ``scripts/soak.py``
(many more). A failure shrinks to a minimal sequence of ``state.checkpoint(...)`` and
``state.restore(...)`` steps, printed by Hypothesis.
"""

from __future__ import annotations

import itertools
import os
import pathlib
from collections import Counter
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.spark.sink_model import DELETE, POISON, Config, Harness, Model, Row, key_of

K1 = [None, "", "a", "é✓𝄞"]
K2 = [None, 0, 7]
ALL_KEYS = [(a, b) for a in K1 for b in K2]
HOT_KEYS = [(None, None), ("", 0), ("é✓𝄞", 7)]
VALUES = ["x", "", None, "ü𝄞", "y"]
FAULTS = ["none", "commit_twice", "second_attempt", "abort", "abandon"]
"""What happens to a checkpoint: committed; committed twice (a finalize retry, then the next trigger's
recovery commits it a third time); staged by attempt 1 and again by attempt 2, attempt 2 committed;
staged then aborted; staged then abandoned (the next trigger aborts it); PostgreSQL also: the
server crashes between stage and commit."""

_targets = itertools.count()


@dataclass
class Env:
    """What every machine shares: the Spark session, the scratch root, PostgreSQL (or ``None``), a
    delta-spark session reading Delta tables too (or ``None``)."""

    spark: Any
    root: pathlib.Path
    server: Any = None
    delta_spark: Any = None


def batches(config: Config) -> st.SearchStrategy[Batch]:
    """A checkpoint's input: cold keys, then hot keys changed up to ~10 times (nulls, '' and unicode in
    key parts), then exact duplicates of some; possibly empty; NUL bytes for the PostgreSQL dead letters;
    deletes (often) where the sink applies them."""
    keys, hot = ALL_KEYS, HOT_KEYS
    if not config.null_keys:
        keys, hot = [k for k in keys if None not in k], [("", 0), ("é✓𝄞", 7), ("a", 0)]
    key = st.sampled_from(hot) | st.sampled_from(keys)
    value = st.sampled_from(VALUES + ([POISON] if config.dead_letters else []) + [DELETE] * 3 * config.deletes)
    row = st.tuples(key, st.integers(0, 3), value).map(lambda t: (t[0][0], t[0][1], t[1], t[2]))

    @st.composite
    def batch(draw: st.DrawFn) -> Batch:
        cold, rows = draw(st.integers(0, 24)), draw(st.lists(row, max_size=14))
        dups = [rows[i % len(rows)] for i in draw(st.lists(st.integers(0, 13), max_size=3))] if rows else []
        dropped = draw(st.integers(0, 24)) if config.deletes else 0
        return Batch(cold, _per_key(config, rows + dups), dropped)

    return batch()


@dataclass(frozen=True)
class Batch:
    """A checkpoint's input: ``cold`` rows of rarely changed keys (files big enough that a hot key's
    change deletes a small part of them: a deletion vector, no compaction; enough changed rows for
    the merge in Spark), then deletes of the first ``dropped`` cold keys (whether this checkpoint or an
    earlier one wrote them, or none: whole files deleted, compacted, or nothing to delete), then ``hot``
    rows. Printed short when Hypothesis reports a failure."""

    cold: int
    hot: list[Row]
    dropped: int = 0

    def rows(self) -> list[Row]:
        cold = [(f"cold{i}", i % 3, 0, "cold") for i in range(self.cold)]
        return cold + [(f"cold{i}", i % 3, 0, DELETE) for i in range(self.dropped)] + self.hot


def _per_key(config: Config, rows: list[Row]) -> list[Row]:
    """Upsert: a refused row only where it is its key's one row in the checkpoint (the rule for a refused
    row among accepted ones of its key is not documented); ``one_row_per_key``: the later row of each key."""
    if config.mode != "upsert":
        return rows
    if config.one_row_per_key:
        rows = list({key_of(r): r for r in rows}.values())
    counts: dict[Any, int] = {}
    for r in rows:
        counts[key_of(r)] = counts.get(key_of(r), 0) + 1
    return [(r[0], r[1], r[2], "nul") if r[3] == POISON and counts[key_of(r)] > 1 else r for r in rows]


def _diff(got: list[Any], expected: list[Any]) -> str:
    """What a reader got that the model does not have, and the reverse (as multisets)."""
    extra, missing = Counter(got) - Counter(expected), Counter(expected) - Counter(got)
    return (
        f"{len(got)} rows; extra {sorted(extra.elements(), key=repr)}, missing {sorted(missing.elements(), key=repr)}"
    )


def machine_for(config: Config, env: Env) -> type[RuleBasedStateMachine]:
    faults = [f for f in FAULTS + (["server_crash"] if config.kind == "postgres" else []) if f not in config.faults]

    class SinkMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.harness = Harness(
                config, env.spark, env.root, f"m{next(_targets)}-{config.name}", env.server, env.delta_spark
            )
            self.model = Model(config)
            self.next_id = 1
            self.committables: dict[int, Any] = {}
            self.abandoned: int | None = None
            self.restored = False  # no restore right after a restore: it would only repeat

        def _trigger(self, restore_pending: bool = False) -> None:
            """The coordinator's recovery: re-commit the latest completed checkpoint (not while a
            restore is pending), abort the abandoned attempt."""
            if self.model.timeline and not restore_pending:
                latest = self.model.timeline[-1]
                self.harness.commit(latest, self.committables[latest])
            if self.abandoned is not None:
                self.harness.abort(self.abandoned)
                self.abandoned = None

        @initialize()
        def start(self) -> None:
            pass

        @rule(batch=batches(config), fault=st.sampled_from(faults))
        def checkpoint(self, batch: Batch, fault: str) -> None:
            rows = batch.rows()
            self._trigger()
            self.restored = False
            c, self.next_id = self.next_id, self.next_id + 1
            if fault == "second_attempt":
                leaked = [(r[0], r[1], 9, "attempt-1") for r in rows] or [("a", 0, 9, "attempt-1")]
                self.harness.stage(c, 1, leaked)
                committables = self.harness.stage(c, 2, rows)
            else:
                committables = self.harness.stage(c, 1, rows)
            if fault == "abort":
                self.harness.abort(c)
                return
            if fault == "abandon":
                self.abandoned = c
                return
            if fault == "server_crash":
                self.harness.crash_server()
            self.harness.commit(c, committables)
            if fault == "commit_twice":
                self.harness.commit(c, committables)
            self.committables[c] = committables
            self.model.commit(c, rows)

        @precondition(lambda self: bool(self.model.timeline) and not self.restored)
        @rule(back=st.integers(0, 2))
        def restore(self, back: int) -> None:
            """Restore the checkpoint ``back`` completed checkpoints before the latest (at most the oldest
            restorable one)."""
            restorable = self.model.restorable()
            c = restorable[max(0, len(restorable) - 1 - back)]
            self._trigger(restore_pending=True)
            self.harness.rollback(c)
            self.harness.commit(c, self.committables[c])  # the restored checkpoint's output again
            self.model.restore(c)
            self.restored = True

        @invariant()
        def tables_match_the_model(self) -> None:
            expected = self.model.expected()
            read = {reader: read() for reader, read in self.harness.readers().items()}
            wrong = "".join(f"\n  {reader}: {_diff(got, expected)}" for reader, got in read.items() if got != expected)
            assert not wrong, (
                f"{config.name} after checkpoint {self.next_id - 1}, {len(expected)} rows expected:{wrong}"
            )
            if config.dead_letters:
                got_dead, expected_dead = self.harness.dead_letters(), self.model.expected_dead()
                assert got_dead == expected_dead, f"{config.name} dead letters: {_diff(got_dead, expected_dead)}"

    SinkMachine.__name__ = SinkMachine.__qualname__ = f"SinkMachine_{config.name.replace('-', '_')}"
    return SinkMachine


def run(
    config: Config, env: Env, seed: int, examples: int, steps: int, shrink: bool = True, shrink_seconds: int = 300
) -> None:
    """Run the machine for ``config`` from ``seed``: ``examples`` sequences of up to ``steps`` steps; a
    failure is shrunk for at most ``shrink_seconds`` (Hypothesis's own bound is 300 s)."""
    verbose = bool(os.environ.get("SINK_MODEL_VERBOSE"))
    run_machine(machine_for(config, env), seed, examples, steps, shrink, shrink_seconds, verbose)


def run_machine(
    machine: type[RuleBasedStateMachine],
    seed: int,
    examples: int,
    steps: int,
    shrink: bool,
    shrink_seconds: int,
    verbose: bool = False,
) -> None:
    """Run ``machine`` from ``seed`` as :func:`run` does: no example database, no deadline, every health
    check off (each step runs Spark jobs), shrinking bounded by ``shrink_seconds``."""
    from hypothesis.internal.conjecture import engine

    engine.MAX_SHRINKING_SECONDS = shrink_seconds  # every step runs Spark jobs: bound the shrinking in CI
    machine._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]  # what @seed(...) sets
    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if shrink else [])
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            database=None,
            derandomize=False,
            phases=phases,
            suppress_health_check=list(HealthCheck),
            print_blob=False,
            verbosity=Verbosity.verbose if verbose else Verbosity.normal,
        ),
    )
