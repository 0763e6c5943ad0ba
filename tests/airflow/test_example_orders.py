"""The orders example end to end through ``dag.test()``: two inputs on one barrier, two steps joined by a channel.

After every checkpoint both tables equal a ground truth computed with pandas over the
aligned cuts. Files that land on both inputs while a checkpoint runs belong to the next
one; an update and an order of the same customer in one checkpoint give the updated
segment; a failed downstream step is retried alone and reads the same channel.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pandas as pd
import pytest

from airflow_provider_checkpoint.jobs.audit import audit_job
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.storage.stats import StatsStore
from airflow_provider_checkpoint.testing.clickstream import read_table
from airflow_provider_checkpoint.testing.orders import Cut, enriched, land_changes, land_orders, revenue_by_segment

pytestmark = pytest.mark.airflow
JOB = "example_orders"


def assert_tables(base: Path, cuts: list[Cut]) -> None:
    want = enriched(cuts, "hold", ttl_checkpoints=10**6)
    archive = read_table(base / "marts" / "enriched_orders")
    pd.testing.assert_frame_equal(
        archive[want.columns.tolist()].sort_values("order_id").reset_index(drop=True),
        want.sort_values("order_id").reset_index(drop=True),
        check_dtype=False,
    )
    revenue = read_table(base / "marts" / "revenue_by_segment")
    truth = revenue_by_segment(want)
    pd.testing.assert_frame_equal(
        revenue[truth.columns.tolist()].sort_values("segment", na_position="first").reset_index(drop=True),
        truth.sort_values("segment", na_position="first").reset_index(drop=True),
        check_dtype=False,
    )


def land_when_barrier_is_cut(job_dir: Path, checkpoint_id: int, land: callable) -> threading.Thread:
    """Land files as soon as checkpoint ``checkpoint_id`` has cut its barrier (its plan exists)."""
    plan = job_dir / f"chk-{checkpoint_id}" / "_plan.json"
    cut = threading.Event()

    def watch() -> None:
        while not cut.wait(0.05):
            if plan.exists():
                land()
                cut.set()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    thread.cut = cut  # type: ignore[attr-defined]
    return thread


def test_orders_example_over_aligned_increments(orders_dag, tmp_path, monkeypatch):
    dag, base = orders_dag.dag, tmp_path / "orders"
    job_dir = tmp_path / "checkpoints" / JOB
    cuts: list[Cut] = []

    # 1: customers c0..c4 known; orders of c5..c7 are held
    cuts.append(
        (
            land_orders(base / "orders", "o1.json", 80, 1),
            land_changes(base / "customers", "c1.csv", [(f"c{i}", "retail", 1, "U") for i in range(5)]),
        )
    )
    assert dag.test().state == "success"
    assert_tables(base, cuts)

    # 2: an update and orders of the same customer in one checkpoint; c5 arrives, c2 is deleted;
    #    and while it runs, files land on both inputs: they belong to checkpoint 3
    cuts.append(
        (
            land_orders(base / "orders", "o2.json", 60, 2),
            land_changes(
                base / "customers", "c2.csv", [("c1", "gold", 2, "U"), ("c5", "b2b", 2, "U"), ("c2", "", 2, "D")]
            ),
        )
    )
    late: list[Cut] = []
    watcher = land_when_barrier_is_cut(
        job_dir,
        2,
        lambda: late.append(
            (
                land_orders(base / "orders", "o3.json", 40, 3),
                land_changes(base / "customers", "c3.csv", [("c6", "b2b", 3, "U"), ("c1", "platinum", 3, "U")]),
            )
        ),
    )
    assert dag.test().state == "success"
    assert watcher.cut.is_set(), "the files must have landed while checkpoint 2 ran"
    assert_tables(base, cuts)  # without o3/c3

    # 3: the late files, and the downstream step fails once: it alone is retried, on the same channel
    cuts.append(late[0])
    monkeypatch.setenv("CHECKPOINT_FAULTS", "step.before_ack:checkpoint=3:step=step_publish:attempt=1")
    run = dag.test()
    assert run.state == "success"
    tries = {ti.task_id: ti.try_number for ti in run.get_task_instances()}
    assert tries["step_enrich"] == 1 and tries["step_publish"] == 2
    assert_tables(base, cuts)
    monkeypatch.delenv("CHECKPOINT_FAULTS")

    storage = JobStorage.for_job(f"file://{tmp_path}/checkpoints", JOB)
    stats = StatsStore(storage).read_all()
    assert [s["status"] for s in stats] == ["COMPLETED"] * 3
    assert all(s["channel_rows"] > 0 and s["channel_bytes"] > 0 for s in stats)
    assert audit_job(storage, retained=3, sinks=orders_dag.pipeline.job.graph.sinks) == []
