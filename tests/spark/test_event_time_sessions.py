"""Sessions in incremental state: only the keys with new rows are sessionized, the others only closed.

Three checkpoints of 5-minute-gap sessions with a 10-minute watermark, worked out by hand (minutes
after ``T0``; a row at ``m`` opens ``[m, m + 5)``):

1. ``a@0``, ``a@8``, ``b@1``, ``c@14``: sessions a ``[0,5)``, a ``[8,13)``, b ``[1,6)``, c ``[14,19)``;
   watermark 4, nothing closes.
2. ``a@4`` bridges a's two sessions into ``[0,13)`` (both state rows move); ``c@16`` extends c to
   ``[14,21)``; watermark 6 closes b ``[1,6)``, a key without new rows: closed by the watermark alone.
3. ``c@30`` opens c ``[30,35)``; watermark 20 closes a ``[0,13)``, untouched again.

The state is in files and every checkpoint merges on the driver: the first into an empty state (every
session written), checkpoints 2 and 3 with every open session read, the changed ones written; the
state's row count is the open sessions after each.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from airflow_provider_checkpoint.dataflow import FileSource, ParquetTableSink, WindowAggregate, session
from airflow_provider_checkpoint.testing.inprocess import make_job
from tests.spark.helpers import table, write_json

pytestmark = pytest.mark.spark

T0 = datetime.datetime(2026, 3, 1, tzinfo=datetime.UTC)
BASE = int(T0.timestamp() * 1000)
MIN = 60_000

ROWS = [[("a", 0), ("a", 8), ("b", 1), ("c", 14)], [("a", 4), ("c", 16)], [("c", 30)]]
WATERMARKS = [4, 6, 20]
EMITTED = [  # (user, start, end, clicks, total) in minutes, after each checkpoint
    [],
    [("b", 1, 6, 1, 1)],
    [("a", 0, 13, 3, 12), ("b", 1, 6, 1, 1)],
]
OPEN = [4, 2, 2]  # sessions in state after each checkpoint
CHANGED = [  # state rows the operator's changelog changes
    4,  # every session is new
    6,  # a [0,5), a [8,13) and c [14,19) moved; a [0,13) and c [14,21) written; b [1,6) closed
    2,  # a [0,13) closed; c [30,35) written (c [14,21) unchanged)
]


def declare(tmp: Path) -> None:
    events = FileSource("events", str(tmp / "landing"), "json", "user STRING, ts TIMESTAMP, amount LONG")
    aggs = {"clicks": "count", "total": "sum(amount)"}
    gap = session("5 minutes")
    agg = WindowAggregate("sessions", events, ["user"], "ts", gap, aggs, watermark=("ts", "10 minutes"))
    ParquetTableSink("out", agg, str(tmp / "out"), mode="append")


def emitted(path: Path) -> list[tuple[str, int, int, int, int]]:
    got = table(path)
    if got.empty:
        return []
    minutes = {
        c: (got[c].dt.tz_localize(None).astype("datetime64[ms]").astype("int64") - BASE) // MIN
        for c in ("window_start", "window_end")
    }
    rows = zip(got["user"], minutes["window_start"], minutes["window_end"], got["clicks"], got["total"], strict=True)
    return sorted((u, int(s), int(e), int(c), int(t)) for u, s, e, c, t in rows)


def test_sessions_bridge_and_close_untouched_keys_by_the_watermark(spark, tmp_path):
    job = make_job(spark, tmp_path, declare, inline_state_threshold=0)
    for n, rows in enumerate(ROWS):
        landed = [{"user": u, "ts": (T0 + datetime.timedelta(minutes=m)).isoformat(), "amount": m} for u, m in rows]
        write_json(tmp_path / "landing" / f"e{n}.json", landed)
        completed = job.checkpoint()
        progress = completed.operators["sessions"].event_time
        assert progress is not None and progress.watermark == BASE + WATERMARKS[n] * MIN
        assert emitted(tmp_path / "out") == EMITTED[n], f"after checkpoint {n + 1}"
        (stats,) = completed.stats["steps"].values()
        assert stats["state_rows"] == OPEN[n], f"open sessions after checkpoint {n + 1}"
        assert stats.get("state_keys_changed") == CHANGED[n], f"changelog of checkpoint {n + 1}"
        assert stats.get("state_merged_on_driver") == 1, f"checkpoint {n + 1} merges on the driver"
        assert stats.get("state_incremental") == (1 if n else 0), "the first checkpoint writes a first state"
