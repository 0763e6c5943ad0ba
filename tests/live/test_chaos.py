"""Seeded chaos under the real scheduler: 30+ checkpoints, a random fault in each.

The real Airflow services (LocalExecutor) run, alternately, a single-step variant of the
example pipeline and a two-input, two-step pipeline (orders enriched with customers,
joined by a channel), both keeping incremental state in files, while input keeps
growing (every sixth run lands a file mixing good and malformed lines, which the
clickstream pipeline routes to its dead-letter table); their steps run in ``connect``
mode, through a ``spark_connect`` connection, on a Spark Connect server started by the
test (the other tests cover the embedded ``local`` mode). Before every DAG run the test
writes one fault from the list below into
``CHECKPOINT_FAULTS_FILE`` (re-read by every fault point of every task process, so a
step fault hits both steps of the two-step pipeline); the run may succeed, be retried by
Airflow, or fail. After a last clean run of each, every table must equal the ground
truth computed by pandas over all input (the dead-letter table: the malformed lines by
Python's own parse, each once), and the storage audit must find nothing orphaned.

    CHAOS_SEED=<n> CHAOS_RUNS=<n> pytest tests/live/test_chaos.py   # reproduce a run
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from airflow_provider_checkpoint.jobs.audit import audit_job
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.testing.clickstream import land_events, mismatches, read_table
from airflow_provider_checkpoint.testing.malformed import ground_truth, land_mixed, sorted_frame
from airflow_provider_checkpoint.testing.orders import enriched, land_changes, land_orders, revenue_by_segment
from tests.live.airflow_live import running_airflow
from tests.live.spark_connect import spark_connect_server

pytestmark = pytest.mark.live
DAG_ID = "chaos_clickstream"

CHAOS_DAG = """
import datetime
import os

from airflow_provider_checkpoint import CheckpointedPipeline, FileSource, KeyedAggregate, ParquetTableSink

BASE = os.environ["CHAOS_DIR"]

with CheckpointedPipeline(
    dag_id="chaos_clickstream",
    schedule=None,
    retained_checkpoints=3,
    inline_state_threshold=0,  # state in files: incremental, deltas and compactions in most checkpoints
    tolerable_failed_checkpoints=10_000,
    step_retries=2,
    finalize_retries=1,
    retry_delay=datetime.timedelta(seconds=1),
    on_malformed="dead_letter",  # to <storage root>/chaos_clickstream/dead_letters/events
) as pipeline:
    events = FileSource(uid="events", path=f"{BASE}/landing", format="json", schema="user STRING, page STRING, ts LONG")
    views = KeyedAggregate(uid="page_views", input=events, keys=["page"],
                           aggs={"views": "count", "last_seen": "max(ts)"})
    ParquetTableSink(uid="page_views_table", input=views, path=f"{BASE}/marts/page_views", mode="upsert",
                     keys=["page"], step="main")
    users = KeyedAggregate(uid="user_totals", input=events, keys=["user"],
                           aggs={"events": "count", "first_seen": "min(ts)", "last_seen": "max(ts)"})
    ParquetTableSink(uid="user_totals_table", input=users, path=f"{BASE}/marts/user_totals", mode="upsert",
                     keys=["user"], step="main")
    ParquetTableSink(uid="events_archive", input=events, path=f"{BASE}/marts/events", mode="append", step="main")

dag = pipeline.dag
"""

ORDERS_DAG_ID = "chaos_orders"
ORDERS_DAG = """
import datetime
import os

from airflow_provider_checkpoint import (
    Channel, CheckpointedPipeline, DimensionEnrichment, FileSource, KeyedAggregate, ParquetTableSink,
)

BASE = os.environ["CHAOS_DIR"] + "/orders"

with CheckpointedPipeline(
    dag_id="chaos_orders",
    schedule=None,
    retained_checkpoints=3,
    inline_state_threshold=0,
    tolerable_failed_checkpoints=10_000,
    step_retries=2,
    finalize_retries=1,
    retry_delay=datetime.timedelta(seconds=1),
) as pipeline:
    orders = FileSource(uid="orders", path=f"{BASE}/orders", format="json",
                        schema="order_id LONG, customer_id STRING, amount LONG")
    customers = FileSource(uid="customers", path=f"{BASE}/customers", format="csv",
                           schema="customer_id STRING, segment STRING, updated_at LONG, op STRING")
    enriched = DimensionEnrichment(uid="enrich_orders", facts=orders, dimension=customers, keys=["customer_id"],
                                   version="updated_at", columns=["segment"], on_missing="hold",
                                   hold_ttl=datetime.timedelta(days=1))
    channel = Channel(uid="enriched_orders", input=enriched, step="enrich")
    revenue = KeyedAggregate(uid="revenue", input=channel, keys=["segment"],
                             aggs={"revenue": "sum(amount)", "orders": "count"})
    ParquetTableSink(uid="revenue_table", input=revenue, path=f"{BASE}/marts/revenue_by_segment", mode="upsert",
                     keys=["segment"], step="publish")
    ParquetTableSink(uid="orders_archive", input=channel, path=f"{BASE}/marts/enriched_orders", step="publish")

dag = pipeline.dag
"""

# name → fault specs (see airflow_provider_checkpoint.core.faults); weights favour the cheap ones
FAULTS: dict[str, tuple[int, list[str]]] = {
    "none": (3, []),
    "step fails before writing state (attempt 1)": (2, ["step.before_state_write:attempt=1"]),
    "step fails after writing state (attempt 1)": (2, ["step.after_state_write:attempt=1"]),
    "step fails while compacting state (attempt 1)": (2, ["step.during_compaction:attempt=1"]),
    "step SIGKILLed while compacting state (attempt 1)": (1, ["step.during_compaction:attempt=1:action=kill"]),
    "step fails before its ack (attempt 1)": (2, ["step.before_ack:attempt=1"]),
    "step SIGKILLed before its ack (attempt 1)": (2, ["step.before_ack:attempt=1:action=kill"]),
    "step storage error on every attempt": (1, ["step.before_state_write:action=oserror"]),
    "finalize fails before _metadata": (2, ["finalize.before_metadata"]),
    "finalize fails after _metadata (every attempt)": (2, ["finalize.after_metadata"]),
    "finalize SIGKILLed after _metadata": (1, ["finalize.after_metadata:action=kill"]),
    "finalize fails between two sink commits": (
        2,
        ["finalize.between_sink_commits:sink=page_views_table", "finalize.between_sink_commits:sink=orders_archive"],
    ),
    "storage error writing _metadata": (2, ["storage.write:file=_metadata:action=oserror"]),
    "storage error writing _job.json": (1, ["storage.write:file=_job.json:action=oserror"]),
    "trigger SIGKILLed holding the lease": (1, ["storage.write:file=_plan.json:action=kill"]),
}


class ChaosOrders:
    """Orders and customers for the two-step pipeline. Customers are only ever added, each with
    one segment, so the truth does not depend on how failed runs regroup the input into cuts."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.orders: list[dict[str, object]] = []
        self.customers: list[dict[str, object]] = []
        for directory in ("orders", "customers"):
            (base / directory).mkdir(parents=True, exist_ok=True)

    def land(self, run: int, rng: random.Random) -> None:
        known = len(self.customers)
        new = [(f"c{i}", rng.choice(["retail", "gold", "b2b"]), run, "U") for i in range(known, known + 2)]
        self.customers += land_changes(self.base / "customers", f"c-{run:03d}.csv", new)
        self.orders += land_orders(self.base / "orders", f"o-{run:03d}.json", rng.randrange(20, 120), run, known + 4)

    def mismatches(self) -> dict[str, str]:
        want = enriched([(self.orders, self.customers)], "hold", ttl_checkpoints=10**6)
        out = {}
        for name, truth, key in (
            ("enriched_orders", want, "order_id"),
            ("revenue_by_segment", revenue_by_segment(want), "segment"),
        ):
            got = read_table(self.base / "marts" / name)
            try:
                pd.testing.assert_frame_equal(
                    got[truth.columns.tolist()].sort_values(key).reset_index(drop=True),
                    truth.sort_values(key).reset_index(drop=True),
                    check_dtype=False,
                )
            except (AssertionError, KeyError) as e:
                out[name] = f"{len(got)} rows vs {len(truth)} expected: {str(e).splitlines()[0]}"
        return out


def test_chaos_under_the_real_scheduler(tmp_path_factory: pytest.TempPathFactory) -> None:
    seed = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(1_000_000))
    runs = int(os.environ.get("CHAOS_RUNS", "30"))
    print(f"\nchaos seed {seed} ({runs} runs); reproduce with CHAOS_SEED={seed}")
    rng = random.Random(seed)
    root = tmp_path_factory.mktemp("chaos")
    base = root / "chaos-data"
    dags = root / "chaos-dags"
    dags.mkdir()
    (dags / "chaos_clickstream.py").write_text(CHAOS_DAG)
    (dags / "chaos_orders.py").write_text(ORDERS_DAG)
    orders = ChaosOrders(base / "orders")
    faults_file = root / "faults.txt"
    started = time.monotonic()
    names = list(FAULTS)
    weights = [FAULTS[n][0] for n in names]
    landed: list[pd.DataFrame] = []
    mixed: list[str] = []  # files of good and malformed lines
    outcomes: Counter[str] = Counter()
    with contextlib.ExitStack() as stack:
        remote = stack.enter_context(spark_connect_server(root / "spark-connect.log"))
        env = {
            "CHAOS_DIR": str(base),
            "CHECKPOINT_FAULTS_FILE": str(faults_file),
            # connect mode through a spark_connect connection: no JVM per step attempt
            "AIRFLOW_CONN_CHAOS_SPARK_CONNECT": json.dumps(
                {"conn_type": "spark_connect", "host": "127.0.0.1", "port": int(remote.rsplit(":", 1)[1])}
            ),
            "AIRFLOW__CHECKPOINT__SPARK_CONN_ID": "chaos_spark_connect",
        }
        live = stack.enter_context(
            running_airflow(root / "airflow", dags_folder=dags, dag_ids=(DAG_ID, ORDERS_DAG_ID), extra_env=env)
        )
        final: dict[str, str] = {}
        for run in range(1, runs + 3):
            dag_id = DAG_ID if run % 2 else ORDERS_DAG_ID
            if dag_id == DAG_ID:
                for part in range(rng.choice((1, 1, 2))):
                    size = rng.randrange(50, 400)
                    landed.append(land_events(base / "landing", f"e-{run:03d}-{part}.json", size, 1000 * run + part))
                if run % 6 == 1:  # no draw from rng: a seed lands the same events as before
                    mixed.append(f"mixed-{run:03d}.json")
                    land_mixed(base / "landing", mixed[-1], "json", 60, seed=run)
            else:
                orders.land(run, rng)
            fault = "none" if run > runs else rng.choices(names, weights)[0]
            faults_file.write_text("\n".join(FAULTS[fault][1]) + "\n")
            run_id = live.trigger(dag_id, {})
            final[dag_id] = state = live.wait_for_run(dag_id, run_id, timeout=300, expect_success=False)
            outcomes[f"{fault} → {state}"] += 1
            print(f"run {run:>2} [{time.monotonic() - started:6.0f}s] {dag_id:<18} {fault:<48} {state}", flush=True)
        faults_file.write_text("")
        assert final == {DAG_ID: "success", ORDERS_DAG_ID: "success"}, "the last, fault-free runs must succeed"

    good, dead = ground_truth("events", base / "landing", "json", {0: mixed})
    problems = {**mismatches(base / "marts", pd.concat([*landed, good])), **orders.mismatches()}
    storage = JobStorage.for_job(f"file://{root / 'airflow' / 'checkpoints'}", DAG_ID)
    dead_letters = read_table(Path(storage.job_dir) / "dead_letters" / "events")
    key = ["source", "file", "line", "raw"]  # checkpoint ids depend on how failed runs regrouped the input
    if not sorted_frame(dead_letters, key).equals(sorted_frame(dead, key)):
        problems["dead_letters"] = f"{len(dead_letters)} dead letters vs {len(dead)} malformed lines"
    orders_storage = JobStorage.for_job(f"file://{root / 'airflow' / 'checkpoints'}", ORDERS_DAG_ID)
    findings = audit_job(storage, retained=3) + audit_job(orders_storage, retained=3)
    stats = [json.loads(p.read_text()) for p in sorted((Path(storage.job_dir) / "_stats").glob("*.json"))]
    print("outcomes:", dict(outcomes))
    print("checkpoints:", Counter((s["status"], s.get("reason", "")) for s in stats))
    elapsed = time.monotonic() - started
    print(f"chaos finished in {elapsed:.0f}s (seed {seed})")
    assert problems == {}, f"seed {seed}: tables differ from the ground truth: {problems}"
    assert findings == [], f"seed {seed}: storage audit: {findings}"
    staged = [
        *(base / "marts").glob("*/_staging/chk-*"),
        *(base / "orders" / "marts").glob("*/_staging/chk-*"),
        *(Path(storage.job_dir) / "dead_letters").glob("*/_staging/chk-*"),
    ]
    assert staged == [], f"seed {seed}: staged sink data left behind: {staged}"
    steps = [m for s in stats if s["status"] == "COMPLETED" for m in s.get("steps", {}).values()]
    assert any(m.get("state_keys_changed") for m in steps), "no checkpoint continued its state incrementally"
    assert elapsed < 20 * 60, f"chaos took {elapsed:.0f}s, more than 20 minutes"
