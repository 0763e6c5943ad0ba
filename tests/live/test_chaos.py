"""Seeded chaos under the real scheduler: 5+ checkpoints (``CHAOS_RUNS``; 12 in ``make test-full``),
a random fault in each.

The real Airflow services (LocalExecutor) run, in turn, the five pipelines of
:mod:`tests.live.chaos_dags`: a single-step variant of the example pipeline writing Parquet,
Delta (user totals, upsert) and PostgreSQL (page views, upsert) tables; a two-input, two-step
pipeline (orders enriched with customers, joined by a channel); a chained pipeline
(``chain=True``: one task per checkpoint) appending events to PostgreSQL and upserting user
totals into Delta; and the same tables from a Kafka topic on Apache Kafka's own broker (the
session's, restarted between some runs; some runs kill a Spark task mid-read), its events also
published to a second topic by ``KafkaSink``; and a PostgreSQL table's row changes captured by
``PostgresCdcSource`` into Delta and PostgreSQL upsert tables, random transactions on the source table
between runs (:mod:`tests.live.chaos_cdc`; truth: a ``SELECT`` of the source table). The ground truth
of the Kafka tables and of the second topic (read back ``read_committed`` by a plain consumer) is
what the test produced, with the partition and offset the broker acknowledged for each record. All
keep incremental state in files while input keeps growing (every sixth run lands a file mixing good and malformed lines,
which the clickstream pipeline routes to its dead-letter table; the same step windows clicks by
event time, out of order and late, into an append table checked against a plain-Python model:
:mod:`tests.live.chaos_windows`). Steps run in ``connect`` mode, through a ``spark_connect``
connection, on a Spark Connect server started by the test; PostgreSQL is the session's server
(:mod:`tests.servers.postgres`), reached through an Airflow ``postgres`` connection. Before
every DAG run the test writes one fault from the list below into ``CHECKPOINT_FAULTS_FILE``
(re-read by every fault point of every task process, so a step fault hits both steps of the
two-step pipeline); the run may succeed, be retried by Airflow, or fail. After a last clean run of each
pipeline (the five at once, as a scheduler runs several jobs) every table must equal the ground truth
computed by pandas over all input (the dead-letter table: the malformed lines by Python's own parse,
each once); each Delta table holds at most one commit per checkpoint id, and only of completed
checkpoints; each PostgreSQL sink has exactly one marker row per committed checkpoint. Then the restore
DAG returns the clickstream job to its second-newest retained checkpoint and runs it once more on new
input: all its tables must equal the ground truth again (the undone checkpoints' commits and markers
gone). Finally the storage audit, with every sink's own audit (staged files, staging tables), must find
nothing left behind.

    CHAOS_SEED=<n> CHAOS_RUNS=<n> pytest tests/live/test_chaos.py   # reproduce a run
    CHAOS_RUNS=60 pytest tests/live/test_chaos.py                   # a longer soak (a new seed each time)
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from airflow_provider_checkpoint.jobs.audit import audit_job
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.testing.clickstream import (
    expected_tables,
    land_events,
    mismatches,
    normalized,
    read_table,
)
from airflow_provider_checkpoint.testing.malformed import ground_truth, land_mixed, sorted_frame
from airflow_provider_checkpoint.testing.orders import enriched, land_changes, land_orders, revenue_by_segment
from tests.airflow.conftest import load_dag_module
from tests.conftest import REPO, ci_or_full
from tests.live.airflow_live import running_airflow
from tests.live.chaos_cdc import ChaosCdc
from tests.live.chaos_dags import (
    CDC_DAG_ID,
    CDC_TABLE,
    CHAINED_DAG_ID,
    DAG_ID,
    DAG_SOURCES,
    KAFKA_DAG_ID,
    KAFKA_OUT_TOPIC,
    KAFKA_TOPIC,
    ROTATION,
)
from tests.live.chaos_windows import ChaosWindows
from tests.live.spark_connect import spark_connect_server
from tests.live.storage_view import completed_ids, latest_metadata
from tests.servers.kafka import ApacheKafka, KafkaBroker, consume
from tests.servers.postgres import PostgresServer

pytestmark = pytest.mark.live
RESTORE_DAG_ID = "restore_from_checkpoint"
RESTART_BROKER = "Kafka broker restarted before the run"
KILL_MID_READ = "step SIGKILLed mid Kafka read (attempt 1)"

# name → fault specs (see airflow_provider_checkpoint.core.faults); weights favour the cheap ones.
# ``{next}`` is the id the run's barrier gets: the trigger's recovery of the previous checkpoint
# reaches finalize.between_sink_commits too, and must not stop the run before its own finalize.
# Sinks commit in the order of their uids: clickstream events.dead_letters, events_archive,
# page_views_pg, page_views_table, user_last_event_delta, user_totals_delta, user_totals_table;
# chained events_pg, user_totals_delta; orders orders_archive, revenue_table.
# ``action=pause``: the task waits while the test crashes PostgreSQL (immediate shutdown) and
# restarts it (:class:`PostgresCrasher`).
FAULTS: dict[str, tuple[int, list[str]]] = {
    "none": (3, []),
    "step fails before writing state (attempt 1)": (2, ["step.before_state_write:attempt=1"]),
    "step fails after writing state (attempt 1)": (2, ["step.after_state_write:attempt=1"]),
    "step fails while compacting state (attempt 1)": (2, ["step.during_compaction:attempt=1"]),
    "step SIGKILLed while compacting state (attempt 1)": (1, ["step.during_compaction:attempt=1:action=kill"]),
    "step fails before its ack (attempt 1)": (2, ["step.before_ack:attempt=1"]),
    "step SIGKILLed before its ack (attempt 1)": (2, ["step.before_ack:attempt=1:action=kill"]),
    KILL_MID_READ: (2, ["step.kafka_read:attempt=1:action=kill"]),
    RESTART_BROKER: (2, []),
    "step storage error on every attempt": (1, ["step.before_state_write:action=oserror"]),
    "finalize fails before _metadata": (2, ["finalize.before_metadata"]),
    "finalize fails after _metadata (every attempt)": (2, ["finalize.after_metadata"]),
    "finalize SIGKILLed after _metadata": (1, ["finalize.after_metadata:action=kill"]),
    "finalize fails before the PostgreSQL commit": (
        2,
        [
            "finalize.between_sink_commits:checkpoint={next}:sink=events_archive",
            "finalize.between_sink_commits:checkpoint={next}:sink=orders_archive",
        ],
    ),
    "finalize fails after the PostgreSQL commit": (
        2,
        [
            "finalize.between_sink_commits:checkpoint={next}:sink=page_views_pg",
            "finalize.between_sink_commits:checkpoint={next}:sink=events_pg",
        ],
    ),
    "finalize SIGKILLed after the PostgreSQL commit": (
        1,
        [
            "finalize.between_sink_commits:checkpoint={next}:sink=page_views_pg:action=kill",
            "finalize.between_sink_commits:checkpoint={next}:sink=events_pg:action=kill",
        ],
    ),  # fmt: skip
    "finalize fails after the Kafka commit": (
        2,
        ["finalize.between_sink_commits:checkpoint={next}:sink=events_out"],
    ),
    "finalize fails before the Delta commit": (
        2,
        ["finalize.between_sink_commits:checkpoint={next}:sink=page_views_table"],
    ),
    "finalize fails after the Delta commit": (
        2,
        [
            "finalize.between_sink_commits:checkpoint={next}:sink=user_totals_delta",
            "finalize.between_sink_commits:checkpoint={next}:sink=accounts_delta",
        ],
    ),
    "finalize SIGKILLed after the Delta commit": (
        1,
        ["finalize.between_sink_commits:checkpoint={next}:sink=user_totals_delta:action=kill"],
    ),
    "trigger's recovery fails between two sink commits": (
        1,
        [
            "finalize.between_sink_commits:sink=page_views_table",
            "finalize.between_sink_commits:sink=orders_archive",
            "finalize.between_sink_commits:sink=events_pg",
        ],
    ),  # fmt: skip
    "PostgreSQL crashes after a step's ack (attempt 1)": (1, ["step.before_ack:attempt=1:action=pause"]),
    "PostgreSQL crashes after _metadata": (2, ["finalize.after_metadata:checkpoint={next}:action=pause"]),
    "storage error writing _metadata": (2, ["storage.write:file=_metadata:action=oserror"]),
    "storage error writing _job.json": (1, ["storage.write:file=_job.json:action=oserror"]),
    "trigger SIGKILLed holding the lease": (1, ["storage.write:file=_plan.json:action=kill"]),
}


class PostgresCrasher:
    """While a run is active: whenever a task pauses at a fault point, PostgreSQL crashes (immediate
    shutdown, so crash recovery runs) and restarts, then the task resumes."""

    def __init__(self, server: PostgresServer, pause_dir: Path) -> None:
        self.server, self.pause_dir, self.crashes = server, pause_dir, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        pause_dir.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.1):
            for paused in self.pause_dir.glob("*.paused"):
                self.server.kill()
                self.server.start()
                self.crashes += 1
                paused.unlink()
                paused.with_suffix(".resume").touch()

    def next_run(self) -> None:
        """Forget the resumes of the previous run, so each run's pause waits for a crash of its own."""
        for resume in self.pause_dir.glob("*.resume"):
            resume.unlink()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def produce_events(broker: KafkaBroker, n: int, seed: int) -> pd.DataFrame:
    """Produce ``n`` click events to the chaos topic's three partitions; each with the partition and
    offset the broker acknowledged."""
    rng = random.Random(seed)
    rows = [(f"u{rng.randrange(30)}", f"/p{rng.randrange(10)}", seed * 1_000_000 + i) for i in range(n)]
    records = [
        (rng.randrange(3), user.encode(), json.dumps({"user": user, "page": page, "ts": ts}).encode())
        for user, page, ts in rows
    ]
    acked = broker.produce(KAFKA_TOPIC, records)
    frame = pd.DataFrame(rows, columns=["user", "page", "ts"])
    frame["partition"], frame["offset"] = [p for p, _ in acked], [o for _, o in acked]
    return frame


def last_events(events: pd.DataFrame) -> pd.DataFrame:
    """Each user's latest event by ``(ts, page)`` (a null lowest), as the ``sequence_by`` rule keeps it
    (``events`` grow in ``ts`` with their landing order, so no checkpoint replaces a later row)."""
    best: dict[Any, tuple[tuple[Any, ...], dict[str, Any]]] = {}
    for row in events[["user", "page", "ts"]].astype(object).to_dict("records"):
        row = {k: None if pd.isna(v) else v for k, v in row.items()}
        rank = (row["ts"] is not None, row["ts"] or 0, row["page"] is not None, row["page"] or "")
        if row["user"] not in best or rank > best[row["user"]][0]:
            best[row["user"]] = (rank, row)
    return pd.DataFrame([row for _, row in best.values()], columns=["user", "page", "ts"])


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


def delta_commits(table: Path, app_id: str) -> Counter[int]:
    """Checkpoint id → how many entries of ``table``'s ``_delta_log`` carry a ``txn`` action of ``app_id``."""
    counts: Counter[int] = Counter()
    for entry in (table / "_delta_log").glob("*.json"):
        for line in entry.read_text().splitlines():
            txn = json.loads(line).get("txn")
            if txn and txn["appId"] == app_id:
                counts[int(txn["version"])] += 1
    return counts


def pg_frame(db: Any, query: str, *params: object) -> pd.DataFrame:
    cursor = db.execute(query, params)
    return pd.DataFrame(cursor.fetchall(), columns=[c.name for c in cursor.description])


def table_mismatch(got: pd.DataFrame, truth: pd.DataFrame, table: str) -> str | None:
    """How ``got`` differs from ``truth`` (``table``: a table of the clickstream ground truth), ``None`` if equal."""
    try:
        pd.testing.assert_frame_equal(normalized(got[truth.columns.tolist()], table), normalized(truth, table))
    except (AssertionError, KeyError) as e:
        return f"{len(got)} rows vs {len(truth)} expected: {str(e).splitlines()[0]}"
    return None


@dataclass
class ChaosJob:
    """One chaos job's checkpoints: its storage, and which checkpoints committed its sinks."""

    checkpoints: Path
    job_id: str
    rolled_back: set[int] = field(default_factory=set)  # completed, then undone by a restore

    @property
    def storage(self) -> JobStorage:
        return JobStorage.for_job(f"file://{self.checkpoints}", self.job_id)

    @property
    def job_dir(self) -> Path:
        return self.checkpoints / self.job_id

    def next_checkpoint_id(self) -> int:
        """The id the job's next barrier gets (from its id counter)."""
        record = self.job_dir / "_job.json"
        return int(json.loads(record.read_text())["last_checkpoint_id"]) + 1 if record.exists() else 1

    def committed(self) -> set[int]:
        stats = (json.loads(p.read_text()) for p in (self.job_dir / "_stats").glob("*.json"))
        return {int(s["checkpoint_id"]) for s in stats if s["status"] == "COMPLETED"} - self.rolled_back

    def delta_problems(self, table: Path, sink: str, truth: pd.DataFrame) -> dict[str, str]:
        """The Delta table equals ``truth`` (one row per user); one commit per committed checkpoint, no other."""
        from deltalake import DeltaTable

        out = {}
        if problem := table_mismatch(pa.table(DeltaTable(str(table)).scan()).to_pandas(), truth, "user_totals"):
            out[sink] = problem
        commits = delta_commits(table, f"airflow-checkpoint:{self.job_id}:{sink}")
        if set(commits) - self.committed() - self.rolled_back or max(commits.values(), default=0) > 1:
            out[f"{sink} commits"] = f"Delta commits per checkpoint {dict(commits)}, committed {self.committed()}"
        return out

    def pg_problems(self, db: Any, table: str, sink: str, truth: pd.DataFrame, kind: str) -> dict[str, str]:
        """The PostgreSQL table equals ``truth``; exactly one marker per committed checkpoint."""
        out = {}
        if problem := table_mismatch(pg_frame(db, f"SELECT * FROM chaos.{table}"), truth, kind):
            out[sink] = problem
        markers = pg_frame(
            db, "SELECT checkpoint_id FROM chaos.checkpoint_sink_markers WHERE job_id = %s AND sink_uid = %s",
            self.job_id, sink,
        )["checkpoint_id"].tolist()  # fmt: skip
        if sorted(markers) != sorted(self.committed()):
            out[f"{sink} markers"] = f"markers {sorted(markers)}, committed checkpoints {sorted(self.committed())}"
        return out


def clickstream_problems(
    base: Path, clicks: ChaosJob, db: Any, events: pd.DataFrame, dead: pd.DataFrame
) -> dict[str, str]:
    """Every table of the clickstream job (Parquet, Delta, PostgreSQL, dead letters) against the ground truth."""
    truth = expected_tables(events)
    problems = {
        **mismatches(base / "marts", events),
        **clicks.delta_problems(base / "lake" / "user_totals", "user_totals_delta", truth["user_totals"]),
        **clicks.delta_problems(
            base / "lake" / "user_last_event", "user_last_event_delta", last_events(events[events.ts >= 10**9])
        ),
        **clicks.pg_problems(db, "page_views", "page_views_pg", truth["page_views"], "page_views"),
    }
    dead_letters = read_table(clicks.job_dir / "dead_letters" / "events")
    key = ["source", "file", "line", "raw"]  # checkpoint ids depend on how failed runs regrouped the input
    if not sorted_frame(dead_letters, key).equals(sorted_frame(dead, key)):
        problems["dead_letters"] = f"{len(dead_letters)} dead letters vs {len(dead)} malformed lines"
    return problems


def kafka_problems(
    base: Path, job: ChaosJob, db: Any, broker: KafkaBroker, streamed: list[pd.DataFrame]
) -> dict[str, str]:
    """The Kafka job's tables and published topic against what the test produced: each record once, at its
    own offset."""
    if not streamed:
        return {}
    events = pd.concat(streamed, ignore_index=True)
    truth = expected_tables(events[["user", "page", "ts"]])
    problems = {
        **job.delta_problems(base / "kafka" / "lake" / "user_totals", "user_totals_delta", truth["user_totals"]),
        **job.pg_problems(db, "kafka_events", "events_pg", events, "events"),
    }
    fields = ["user", "page", "ts", "partition", "offset"]
    published = Counter(
        tuple(json.loads(m.value())[f] for f in fields) for m in consume(broker, KAFKA_OUT_TOPIC, "read_committed")
    )
    produced = Counter(tuple(r) for r in events[fields].itertuples(index=False, name=None))
    if published != produced:
        twice, missing = published - produced, produced - published
        problems["events_out"] = (
            f"topic {KAFKA_OUT_TOPIC}: {sum(published.values())} records read_committed, {len(produced)} produced "
            f"({sum(twice.values())} extra or doubled, {sum(missing.values())} missing)"
        )
    return problems


def test_chaos_under_the_real_scheduler(
    tmp_path_factory: pytest.TempPathFactory,
    postgres_server: PostgresServer,
    kafka_broker: ApacheKafka,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seed = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(1_000_000))
    runs = int(ci_or_full("CHAOS_RUNS", "5", "12"))  # 5: each pipeline of ROTATION faulted once
    print(f"\nchaos seed {seed} ({runs} runs); reproduce with CHAOS_SEED={seed}")
    rng = random.Random(seed)
    root = tmp_path_factory.mktemp("chaos")
    base = root / "chaos-data"
    dags = root / "chaos-dags"
    dags.mkdir()
    for dag_id, source in DAG_SOURCES.items():
        (dags / f"{dag_id}.py").write_text(source)
    (dags / f"{RESTORE_DAG_ID}.py").write_text((REPO / "dags" / f"{RESTORE_DAG_ID}.py").read_text())
    with postgres_server.connect() as db:
        db.execute("CREATE SCHEMA chaos")
        cdc = ChaosCdc(db)
    monkeypatch.setenv("CHAOS_DIR", str(base))  # the DAG files, loaded here too for their sinks' audit
    monkeypatch.setenv("AIRFLOW_CONN_CHAOS_PG", postgres_server.uri())
    broker = kafka_broker
    broker.create_topic(KAFKA_TOPIC, 3)
    broker.create_topic(KAFKA_OUT_TOPIC, 2)
    orders = ChaosOrders(base / "orders")
    windows = ChaosWindows(base / "clicks")
    faults_file = root / "faults.txt"
    pause_dir = root / "paused"
    started = time.monotonic()
    names = list(FAULTS)
    weights = [FAULTS[n][0] for n in names]
    landed: list[pd.DataFrame] = []
    chained: list[pd.DataFrame] = []
    streamed: list[pd.DataFrame] = []  # produced to Kafka
    mixed: list[str] = []  # files of good and malformed lines
    outcomes: Counter[str] = Counter()
    first_kafka_faults = [KILL_MID_READ, RESTART_BROKER]  # every seed has both; later runs draw
    jobs = {job: ChaosJob(root / "airflow" / "checkpoints", job) for job in ROTATION}
    clicks, chained_job, kafka_job = jobs[DAG_ID], jobs[CHAINED_DAG_ID], jobs[KAFKA_DAG_ID]
    with contextlib.ExitStack() as stack:
        remote = stack.enter_context(spark_connect_server(root / "spark-connect.log"))
        env = {
            "CHAOS_DIR": str(base),
            "CHECKPOINT_FAULTS_FILE": str(faults_file),
            "CHECKPOINT_FAULTS_PAUSE_DIR": str(pause_dir),
            "AIRFLOW_CONN_CHAOS_PG": postgres_server.uri(),
            "AIRFLOW_CONN_CHAOS_KAFKA": broker.uri(),
            # connect mode through a spark_connect connection: no JVM per step attempt
            "AIRFLOW_CONN_CHAOS_SPARK_CONNECT": json.dumps(
                {"conn_type": "spark_connect", "host": "127.0.0.1", "port": int(remote.rsplit(":", 1)[1])}
            ),
            "AIRFLOW__CHECKPOINT__SPARK_CONN_ID": "chaos_spark_connect",
        }
        live = stack.enter_context(
            running_airflow(root / "airflow", dags_folder=dags, dag_ids=(*ROTATION, RESTORE_DAG_ID), extra_env=env)
        )
        crasher = PostgresCrasher(postgres_server, pause_dir)
        stack.callback(crasher.close)
        final: dict[str, str] = {}
        going: list[tuple[int, str, str, int, str]] = []  # runs triggered, not yet waited for
        run = 0
        # the rotation, then fault-free runs of the clickstream until it retains two checkpoints to restore
        while (run := run + 1) <= runs + len(ROTATION) or len(completed_ids(clicks.job_dir)) < 2:
            dag_id = ROTATION[(run - 1) % len(ROTATION)] if run <= runs + len(ROTATION) else DAG_ID
            if dag_id == DAG_ID:
                for part in range(rng.choice((1, 1, 2))):
                    size = rng.randrange(50, 400)
                    landed.append(land_events(base / "landing", f"e-{run:03d}-{part}.json", size, 1000 * run + part))
                windows.land(f"w-{run:03d}.json", random.Random(seed * 1000 + run))  # rng's draws unchanged
                if run % 6 == 1:  # no draw from rng: a seed lands the same events as before
                    mixed.append(f"mixed-{run:03d}.json")
                    land_mixed(base / "landing", mixed[-1], "json", 60, seed=run)
            elif dag_id == CHAINED_DAG_ID:
                chained.append(
                    land_events(base / "chained" / "landing", f"c-{run:03d}.json", rng.randrange(50, 400), run)
                )
            elif dag_id == KAFKA_DAG_ID:
                streamed.append(produce_events(broker, rng.randrange(50, 400), run))
            elif dag_id == CDC_DAG_ID:
                with postgres_server.connect() as db:
                    cdc.churn(db, random.Random(seed * 1000 + run))  # rng's draws unchanged
            else:
                orders.land(run, rng)
            fault = "none" if run > runs else rng.choices(names, weights)[0]
            if dag_id == KAFKA_DAG_ID and first_kafka_faults and run <= runs:
                fault = first_kafka_faults.pop(0)
            if fault == RESTART_BROKER:
                broker.restart()  # its log is on disk: records and committed offsets survive
            specs_id = jobs[dag_id].next_checkpoint_id()
            specs = [spec.format(next=specs_id) for spec in FAULTS[fault][1]]
            faults_file.write_text("\n".join(specs) + "\n")
            crasher.next_run()
            going.append((run, dag_id, live.trigger(dag_id, {}), specs_id, fault))
            if runs < run < runs + len(ROTATION):
                continue  # the rotation's fault-free runs (one per pipeline, the faults file empty) run together
            for run_n, dag_id, run_id, specs_id, fault in going:
                final[dag_id] = state = live.wait_for_run(dag_id, run_id, timeout=300, expect_success=False)
                if dag_id == DAG_ID and completed_ids(clicks.job_dir)[-1:] >= [specs_id]:
                    windows.completed()  # this run's checkpoint read every click landed so far
                outcomes[f"{fault} → {state}"] += 1
                print(
                    f"run {run_n:>2} [{time.monotonic() - started:6.0f}s] {dag_id:<18} {fault:<48} {state}", flush=True
                )
            going.clear()
        faults_file.write_text("")
        print(f"PostgreSQL crashed {crasher.crashes} times", flush=True)
        assert final == dict.fromkeys(ROTATION, "success"), "the last, fault-free runs must succeed"
        good, dead = ground_truth("events", base / "landing", "json", {0: mixed})
        with postgres_server.connect() as db:
            chained_truth = expected_tables(pd.concat(chained))
            problems = {
                **clickstream_problems(base, clicks, db, pd.concat([*landed, good]), dead),
                **windows.problems(base / "marts" / "click_windows"),
                **orders.mismatches(),
                **chained_job.delta_problems(
                    base / "chained" / "lake" / "user_totals", "user_totals_delta", chained_truth["user_totals"]
                ),
                **chained_job.pg_problems(db, "chained_events", "events_pg", chained_truth["events"], "events"),
                **{
                    f"kafka {name}": problem
                    for name, problem in kafka_problems(base, kafka_job, db, broker, streamed).items()
                },
                **{f"cdc {name}": problem for name, problem in cdc.problems(db, base).items()},
            }

            # restore the clickstream job to its second-newest retained checkpoint through the restore
            # DAG (which runs the pipeline once more, on more input): every table equals the truth again
            retained = completed_ids(clicks.job_dir)
            assert len(retained) >= 2, f"seed {seed}: at least two retained checkpoints expected, found {retained}"
            clicks.rolled_back = {c for c in clicks.committed() if c > retained[-2]}
            landed.append(land_events(base / "landing", "e-restore.json", 200, 1000 * run))
            conf = {"job_id": DAG_ID, "checkpoint": str(retained[-2]), "allow_non_restored_state": False,
                    "dry_run": False, "trigger_pipeline": True}  # fmt: skip
            live.wait_for_run(RESTORE_DAG_ID, live.trigger(RESTORE_DAG_ID, conf), timeout=480)
            print(f"restored {DAG_ID} to checkpoint {retained[-2]} [{time.monotonic() - started:6.0f}s]", flush=True)
            assert latest_metadata(clicks.job_dir)["restored_from"] == retained[-2]
            restored = {
                **clickstream_problems(base, clicks, db, pd.concat([*landed, good]), dead),
                **windows.problems(base / "marts" / "click_windows"),
            }
            problems.update({f"after the restore: {table}": problem for table, problem in restored.items()})

    with postgres_server.connect() as db:
        ChaosCdc.drop_slot(db)
    findings = [
        finding
        for job in jobs.values()
        for finding in audit_job(job.storage, 3, load_dag_module(dags / f"{job.job_id}.py").pipeline.job.graph.sinks)
    ]
    stats = [json.loads(p.read_text()) for p in sorted((clicks.job_dir / "_stats").glob("*.json"))]
    print("outcomes:", dict(outcomes))
    print(f"cdc: {cdc.changes} row changes in {CDC_TABLE}")
    print(f"windowed clicks: {len(windows.on_time)} on time, {windows.late} late")
    print("checkpoints:", Counter((s["status"], s.get("reason", "")) for s in stats))
    elapsed = time.monotonic() - started
    print(f"chaos finished in {elapsed:.0f}s (seed {seed})")
    assert problems == {}, f"seed {seed}: tables differ from the ground truth: {problems}"
    assert findings == [], f"seed {seed}: storage audit: {findings}"
    staged = [p for p in (clicks.job_dir / "dead_letters").glob("*/_staging/chk-*")]
    assert staged == [], f"seed {seed}: staged dead letters left behind: {staged}"
    steps = [m for s in stats if s["status"] == "COMPLETED" for m in s.get("steps", {}).values()]
    assert any(m.get("state_keys_changed") for m in steps), "no checkpoint continued its state incrementally"
    # 55 s a run on average (about 20 alone, 36 beside the other worker's tests), 3 minutes for servers and restore
    bound = 55 * (run - 1) + 180
    assert elapsed < bound, f"chaos took {elapsed:.0f}s, more than {bound}s for {run - 1} runs"
