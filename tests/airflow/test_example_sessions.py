"""The sessions example end to end through ``dag.test()``: sessions final once the watermark passes them.

Two checkpoints over clicks whose sessions are worked out by hand below (30-minute gap,
10-minute watermark bound): the first closes two sessions and keeps one open; the second
brings a click to the open session, a click for a session already closed (late: dropped and
counted) and a click that moves the watermark past the open session, which is appended then.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from airflow_provider_checkpoint.testing.clickstream import land_json_lines

pytestmark = pytest.mark.airflow
JOB = "example_sessions"


def at(hhmm: str) -> datetime:
    return datetime.fromisoformat(f"2026-03-01T{hhmm}:00+00:00")


def clicks(*rows: tuple[str, str]) -> list[dict[str, object]]:
    return [{"user": user, "page": "/p", "ts": at(hhmm).isoformat()} for user, hhmm in rows]


def session_rows(*rows: tuple[str, str, str, int, str, str]) -> pd.DataFrame:
    """Sessions as ``(user, window_start, window_end, clicks, first_click, last_click)``."""
    columns = ["user", "window_start", "window_end", "clicks", "first_click", "last_click"]
    frame = pd.DataFrame([(u, at(s), at(e), n, at(f), at(last)) for u, s, e, n, f, last in rows], columns=columns)
    return frame.sort_values(["user", "window_start"]).reset_index(drop=True)


def table(path: Path) -> pd.DataFrame:
    got = pa.table(DeltaTable(str(path)).scan()).to_pandas()
    for column in ("window_start", "window_end", "first_click", "last_click"):
        got[column] = pd.to_datetime(got[column], utc=True).dt.as_unit("us")
    return got.sort_values(["user", "window_start"]).reset_index(drop=True)


def test_sessions_are_appended_once_when_the_watermark_passes_them(sessions_dag, tmp_path):
    dag, base = sessions_dag.dag, tmp_path / "sessions"
    job_dir = tmp_path / "checkpoints" / JOB

    # u1's clicks are 10 and 25 minutes apart: one session; the greatest time, u3's 11:20, puts the
    # watermark at 11:10: u1's session (ends 11:05) and u2's (10:35) are final, u3's (11:50) is not
    land_json_lines(
        base / "landing",
        "c1.json",
        clicks(("u1", "10:10"), ("u2", "10:05"), ("u1", "10:00"), ("u1", "10:35"), ("u3", "11:20")),
    )
    assert dag.test().state == "success"
    first = session_rows(
        ("u1", "10:00", "11:05", 3, "10:00", "10:35"),
        ("u2", "10:05", "10:35", 1, "10:05", "10:05"),
    )
    pd.testing.assert_frame_equal(table(base / "marts" / "sessions")[first.columns], first, check_dtype=False)

    # u2 at 10:20 is late (its session closed at 10:35 <= 11:10); u3 at 11:45 extends the open session
    # to 12:15; u4 at 12:40 moves the watermark to 12:30, past it
    land_json_lines(base / "landing", "c2.json", clicks(("u4", "12:40"), ("u2", "10:20"), ("u3", "11:45")))
    assert dag.test().state == "success"
    both = pd.concat([first, session_rows(("u3", "11:20", "12:15", 2, "11:20", "11:45"))])
    both = both.sort_values(["user", "window_start"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(table(base / "marts" / "sessions")[both.columns], both, check_dtype=False)

    stats = json.loads((job_dir / "_stats" / "2.json").read_text())
    assert sum(step.get("late_rows_dropped", 0) for step in stats["steps"].values()) == 1
    event_time = json.loads((job_dir / "chk-2" / "_metadata").read_text())["operators"]["sessions"]["event_time"]
    assert event_time == {
        "max_event_time": int(at("12:40").timestamp() * 1000),
        "watermark": int(at("12:30").timestamp() * 1000),
    }
