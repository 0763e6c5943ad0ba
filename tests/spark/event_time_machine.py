"""Pieces the event-time state machines share: aggregates and sessions in plain Python, landing rows as
JSON files, reading a windows table back with pyarrow, and the checkpoints and savepoints a restore may pick.

Used by ``tests/spark/test_event_time_model.py`` (one input) and ``tests/spark/test_event_time_inputs_model.py``
(two inputs).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pandas as pd

from airflow_provider_checkpoint.restore.requests import request_restore
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore
from airflow_provider_checkpoint.testing.inprocess import Job
from tests.spark.helpers import table as parquet_table

MINUTE = 60_000
EPOCH_MS = int(datetime.datetime(2026, 3, 1, tzinfo=datetime.UTC).timestamp() * 1000)
"""Where the clock of the landed rows starts."""
Row = tuple[str | None, int | None, int]
"""``(user, ts in ms since the epoch or None, amount)``."""
Aggs = tuple[int, int, int]
"""count, sum and max of ``amount``."""
Window = tuple[str | None, int, int]
"""``(user, start ms, end ms)``."""


def add(aggs: Aggs | None, amount: int) -> Aggs:
    return (1, amount, amount) if aggs is None else (aggs[0] + 1, aggs[1] + amount, max(aggs[2], amount))


def combine(a: Aggs, b: Aggs) -> Aggs:
    return (a[0] + b[0], a[1] + b[1], max(a[2], b[2]))


def merged_sessions(sessions: dict[Window, Aggs], new: Window, aggs: Aggs) -> dict[Window, Aggs]:
    """``sessions`` with ``new`` added: every session of its user that overlaps or touches it merges with it."""
    user, start, end = new
    kept = dict(sessions)
    changed = True
    while changed:
        changed = False
        for key in list(kept):
            if key[0] == user and key[1] <= end and start <= key[2]:
                aggs = combine(aggs, kept.pop(key))
                start, end, changed = min(start, key[1]), max(end, key[2]), True
    kept[(user, start, end)] = aggs
    return kept


def iso(ts: int | None) -> str | None:
    return None if ts is None else datetime.datetime.fromtimestamp(ts / 1000, datetime.UTC).isoformat()


def land(path: Path, rows: list[Row]) -> None:
    """``rows`` as a JSON Lines file at ``path``, appearing whole (written hidden, then renamed)."""
    hidden = path.with_name("." + path.name)
    hidden.write_text("".join(json.dumps({"user": u, "ts": iso(ts), "amount": a}) + "\n" for u, ts, a in rows))
    hidden.rename(path)


def table(path: Path) -> list[tuple[Any, ...]]:
    """A windows table's rows as ``(user, start ms, end ms, n, total, top)``, sorted, as pyarrow reads it."""
    got = parquet_table(path)
    if got.empty:
        return []
    ms = {c: pd.to_datetime(got[c], utc=True).dt.as_unit("ms").astype("int64") for c in ("window_start", "window_end")}
    rows = zip(got["user"], ms["window_start"], ms["window_end"], got["n"], got["total"], got["top"], strict=True)
    return sorted(((None if pd.isna(u) else u, *map(int, rest)) for u, *rest in rows), key=repr)


def rows_table(path: Path) -> list[Row]:
    """A table of input rows ``(user, ts, amount)`` (late data), sorted, as pyarrow reads it."""
    got = parquet_table(path)
    if got.empty:
        return []
    ts = pd.to_datetime(got["ts"], utc=True).dt.as_unit("ms").astype("int64")
    rows = zip(got["user"], ts, got["amount"], strict=True)
    return sorted(((None if pd.isna(u) else u, int(t), int(a)) for u, t, a in rows), key=repr)


def request_restore_to(job: Job, savepoints: dict[int, str], pick: int) -> int:
    """Request a restore to one of the job's retained checkpoints or ``savepoints`` (checkpoint id → URL),
    the ``pick``-th modulo their number, in id order; returns its checkpoint id."""
    store = CompletedCheckpointStore(job.storage)
    retained = {c: job.storage.url(job.storage.chk_dir(c)) for c in store.completed_ids()}
    targets = sorted({**retained, **savepoints}.items())
    checkpoint_id, url = targets[pick % len(targets)]
    request_restore(job.storage, url, False, False)
    return checkpoint_id
