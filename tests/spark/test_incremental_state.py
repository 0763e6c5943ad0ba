"""Incremental keyed state equals a full recomputation, whatever happened in between.

Seeded random sequences of increments run through the real protocol in-process (small
key-group ranges and a low delta bound, so ranges split and compact often), with restores
of older checkpoints, savepoints, rescaled reads and aborted checkpoints mixed in. After
every checkpoint the operator state (read with pyarrow alone, and with Spark) and the
tables are compared with pandas over exactly the input the retained lineage processed,
and the storage audit must be clean: no referenced file deleted, no orphan left. The state is read
with Spark as a step reads it only where no later step reads it (the last checkpoint, one before a
restore): elsewhere the next checkpoint's step does, and its state and tables are checked.
CI runs the ``mixed`` case (the driver's and Spark's merges, crossing); ``make test-full`` all three.
"""

from __future__ import annotations

import functools
import json
import os
import random
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from airflow_provider_checkpoint.core.faults import ENV as FAULTS_ENV
from airflow_provider_checkpoint.dataflow import (
    FileSource,
    KeyedAggregate,
    KeyedStateFunction,
    ParquetTableSink,
    stateful,
)
from airflow_provider_checkpoint.exceptions import CheckpointAborted, StateFileError
from airflow_provider_checkpoint.jobs.audit import audit_job
from airflow_provider_checkpoint.restore.requests import read_state, request_restore
from airflow_provider_checkpoint.state import checkpointing
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore
from airflow_provider_checkpoint.storage.job_records import JobRecordStore
from airflow_provider_checkpoint.testing.clickstream import land_json_lines, read_table
from airflow_provider_checkpoint.testing.inprocess import Job, make_job

SEED = int(os.environ.get("INCREMENTAL_SEED", "7"))
USERS = 40


def _totals(events, state):  # a state function that deletes keys: a user whose total hits a multiple of 5 is reset
    from pyspark.sql import functions as F

    batch = events.groupBy("user").agg(F.sum("amount").alias("added"))
    joined = state.join(batch, "user", "full_outer")
    total = F.coalesce(F.col("total"), F.lit(0)) + F.coalesce(F.col("added"), F.lit(0))
    merged = joined.select("user", total.alias("total"), F.col("added").isNotNull().alias("changed"))
    new_state = merged.where(F.col("total") % 5 != 0).select("user", "total")
    return new_state, merged.where("changed").select("user", "total")


STATS = {
    "mean": "avg(amount)",
    "first_page": "first(page, ts)",
    "last_page": "last(page, ts)",
    "top_page": "max_by(page, amount)",
    "low_page": "min_by(page, amount)",
    "pages": "collect_set(page, 2)",
    "times": "approx_count_distinct(ts)",
}
"""Every mergeable aggregate but the simple ones (``views`` has those); ``ts`` and ``amount`` have ties."""
SPARK_ONLY = ("pages", "times")
"""The aggregates whose state Spark alone merges: without them, the driver merges ``stats`` too."""


def declare(base: Path, stats: dict[str, str] = STATS) -> None:
    events = FileSource(
        uid="events", path=f"{base}/landing", format="json", schema="user STRING, page STRING, amount LONG, ts LONG"
    )
    views = KeyedAggregate(uid="views", input=events, keys=["user", "page"], aggs={"n": "count", "top": "max(amount)"})
    ParquetTableSink(uid="views_table", input=views, path=f"{base}/views", mode="upsert", keys=["user", "page"])
    aggregate = KeyedAggregate(uid="stats", input=events, keys=["user"], aggs=stats)
    ParquetTableSink(uid="stats_table", input=aggregate, path=f"{base}/stats", mode="upsert", keys=["user"])
    totals = KeyedStateFunction(
        uid="totals", input=events, keys=["user"], fn=_totals, state_schema="user STRING, total LONG"
    )
    ParquetTableSink(uid="totals_table", input=totals, path=f"{base}/totals", mode="upsert", keys=["user"])


class Truth:
    """The expected state after each checkpoint, replayed with pandas per checkpoint batch.

    A checkpoint processes the files landed after its restore point's cut, up to its own;
    its state holds the batches of its lineage (restore point's lineage, then its own).
    """

    def __init__(self) -> None:
        self.files: list[pd.DataFrame] = []
        self.cut: dict[int, int] = {0: 0}  # checkpoint id → files landed before its barrier
        self.lineage: dict[int, list[int]] = {0: []}

    def completed(self, checkpoint_id: int, restored_from: int) -> None:
        self.cut[checkpoint_id] = len(self.files)
        self.lineage[checkpoint_id] = [*self.lineage[restored_from], checkpoint_id]

    def batch(self, checkpoint_id: int) -> pd.DataFrame:
        lineage = self.lineage[checkpoint_id]
        start = self.cut[lineage[-2]] if len(lineage) > 1 else 0
        return pd.concat(self.files[start : self.cut[checkpoint_id]])

    def views(self, checkpoint_id: int) -> pd.DataFrame:
        events = pd.concat(self.files[: self.cut[checkpoint_id]])
        return events.groupby(["user", "page"]).agg(n=("amount", "size"), top=("amount", "max")).reset_index()

    def stats(self, checkpoint_id: int) -> pd.DataFrame:
        """:data:`STATS` by their definitions: ties on the order go to the smallest (first, min_by) or
        largest (last, max_by) value; the distinct count is exact this small (the sketch keeps every hash)."""
        events = pd.concat(self.files[: self.cut[checkpoint_id]])
        rows = []
        for user, g in events.groupby("user"):
            at = {n: g[g[c] == f(g[c])]["page"] for n, c, f in (("ts0", "ts", min), ("ts1", "ts", max))}
            at |= {n: g[g["amount"] == f(g["amount"])]["page"] for n, f in (("a0", min), ("a1", max))}
            rows.append(
                {
                    "user": user,
                    "mean": g["amount"].mean(),
                    "first_page": min(at["ts0"]),
                    "last_page": max(at["ts1"]),
                    "top_page": max(at["a1"]),
                    "low_page": min(at["a0"]),
                    "pages": sorted(set(g["page"]))[:2],
                    "times": g["ts"].nunique(),
                }
            )
        return pd.DataFrame(rows)

    def totals(self, checkpoint_id: int) -> pd.DataFrame:
        state: dict[str, int] = {}
        for c in self.lineage[checkpoint_id]:
            for user, added in self.batch(c).groupby("user")["amount"].sum().items():
                total = state.pop(user, 0) + int(added)
                if total % 5:
                    state[user] = total
        return pd.DataFrame(sorted(state.items()), columns=["user", "total"])


def _land(base: Path, rng: random.Random, n: int, name: str) -> pd.DataFrame:
    hot = rng.sample(range(USERS), min(USERS, max(3, n // 20)))  # an increment touches few keys, some many times
    rows = [
        {
            "user": f"u{rng.choice(hot)}",
            "page": f"/p{rng.randrange(4)}",
            "amount": rng.randrange(1, 9),
            "ts": rng.randrange(60),
        }
        for _ in range(n)
    ]
    land_json_lines(base / "landing", name, rows)
    return pd.DataFrame(rows)


def _sorted(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    text = ("user", "page", *(c for c in STATS if c != "times"))
    return (
        df[sorted(df.columns)]
        .astype({c: "int64" for c in df.columns if c not in text})
        .sort_values(keys)
        .reset_index(drop=True)
    )


def _check(job: Job, truth: Truth, checkpoint_id: int, spark: bool) -> None:
    """The state of ``checkpoint_id`` read with pyarrow, and with ``spark`` as a step reads it (else the next
    checkpoint's step reads it, and its state and tables are checked)."""
    pointer = job.storage.url(job.storage.chk_dir(checkpoint_id))
    for uid, want, keys in (
        ("views", truth.views(checkpoint_id), ["user", "page"]),
        ("totals", truth.totals(checkpoint_id), ["user"]),
    ):
        got = read_state(pointer, uid).to_pandas()
        pd.testing.assert_frame_equal(_sorted(got, keys), _sorted(want, keys), check_dtype=False)
        assert CompletedCheckpointStore(job.storage).load(checkpoint_id).operators[uid].rows == len(want)
        if spark:
            back = read_state(pointer, uid, spark=job.spark).toPandas()  # what the next step reads
            pd.testing.assert_frame_equal(_sorted(back, keys), _sorted(want, keys), check_dtype=False)
    state = read_state(pointer, "stats").to_pandas()  # the hidden columns of avg: sum and count
    events = pd.concat(truth.files[: truth.cut[checkpoint_id]]).groupby("user")["amount"]
    want = pd.DataFrame({"__mean__sum": events.sum(), "__mean__count": events.count()}).reset_index()
    got = state[["user", "__mean__sum", "__mean__count"]]
    pd.testing.assert_frame_equal(_sorted(got, ["user"]), _sorted(want, ["user"]), check_dtype=False)


def _tables_match(base: Path, truth: Truth, checkpoint_id: int, aggs: list[str]) -> None:
    views, totals = read_table(base / "views"), read_table(base / "totals")
    want = truth.views(checkpoint_id)
    pd.testing.assert_frame_equal(_sorted(views, ["user", "page"]), _sorted(want, ["user", "page"]), check_dtype=False)
    stats = read_table(base / "stats")
    if "pages" in aggs:
        stats["pages"] = stats["pages"].map(list)
    assert list(stats.columns) == ["user", *aggs]  # no hidden state column
    want = truth.stats(checkpoint_id)[["user", *aggs]]
    pd.testing.assert_frame_equal(_sorted(stats, ["user"]), _sorted(want, ["user"]))
    # the totals table keeps the last emitted total of every user ever changed: a reset user is not deleted
    assert set(truth.totals(checkpoint_id)["user"]) <= set(totals["user"])


@pytest.mark.parametrize(
    ("driver_merge_rows", "shuffle_merge_rows"),
    [
        pytest.param(1_000_000, 250_000, marks=pytest.mark.full),
        (60, 250_000),
        pytest.param(0, 20, marks=pytest.mark.full),
    ],
    ids=["driver", "mixed", "large state"],
)
def test_incremental_state_equals_full_recomputation(
    spark, tmp_path, small_ranges, monkeypatch, driver_merge_rows, shuffle_merge_rows
):
    """``driver``: the aggregate's state is merged with pyarrow on the driver; ``mixed``: on the
    driver while the state has at most 60 rows, by Spark jobs once it grows (most checkpoints)
    and back on restores, each path continuing the other's files; ``large state``: by Spark, the
    state "large" above 20 rows (semi-joined with small increments, aggregated with the
    per-key aggregates of big ones) and deltas above 10 rows written one task per range. ``stats``
    holds the aggregates the driver can merge in ``driver`` and ``mixed`` (so its state crosses
    between the two paths too), and all of them in ``large state``."""
    monkeypatch.setattr(stateful, "SHUFFLE_MERGE_ROWS", shuffle_merge_rows)
    monkeypatch.setattr(checkpointing, "RANGE_ROWS", 10)
    rng = random.Random(SEED)
    stats = STATS if driver_merge_rows == 0 else {k: v for k, v in STATS.items() if k not in SPARK_ONLY}
    job = make_job(
        spark,
        tmp_path,
        functools.partial(declare, stats=stats),
        inline_state_threshold=0,
        retained_checkpoints=3,
        driver_merge_rows=driver_merge_rows,
    )
    truth = Truth()
    savepoint: tuple[str, int] | None = None
    latest = 0
    seen_delta = seen_compaction = seen_tombstone = False
    actions = ["restore", "savepoint", "restore savepoint", "abort", "rescale", "rescale", *["increment"] * 5]
    rng.shuffle(actions)
    first, second = actions.index("savepoint"), actions.index("restore savepoint")
    actions[min(first, second)], actions[max(first, second)] = "savepoint", "restore savepoint"
    sequence = ["increment"] * 3 + actions
    for step, action in enumerate(sequence, start=1):
        restored_from = latest
        if action == "restore" and len(CompletedCheckpointStore(job.storage).completed_ids()) > 1:
            restored_from = rng.choice(CompletedCheckpointStore(job.storage).completed_ids()[:-1])
            request_restore(job.storage, job.storage.url(job.storage.chk_dir(restored_from)), False, False)
        elif action == "restore savepoint" and savepoint is not None:
            request_restore(job.storage, savepoint[0], False, False)
            restored_from = savepoint[1]
        elif action == "rescale":
            spark.conf.set("spark.sql.shuffle.partitions", str(rng.choice([1, 3, 5])))
        truth.files.append(_land(tmp_path, rng, rng.randrange(20, 120), f"e{step:03d}.json"))
        if action == "abort":
            monkeypatch.setenv(FAULTS_ENV, "finalize.before_metadata")
            with pytest.raises(CheckpointAborted):
                job.checkpoint()
            monkeypatch.delenv(FAULTS_ENV)
            assert audit_job(job.storage, 3, job.graph.sinks) == []
            continue
        target = f"file://{tmp_path}/savepoints/sp-{step}" if action == "savepoint" else None
        completed = job.checkpoint(savepoint_target=target)
        cid = latest = completed.checkpoint_id
        truth.completed(cid, restored_from)
        if target:
            savepoint = (target, cid)
            written = json.loads((tmp_path / "savepoints" / f"sp-{step}" / "_metadata").read_text())
            assert all("delta" not in h for op in written["operators"].values() for h in op["handles"])
        handles = [h for op in completed.operators.values() for h in op.handles]
        for h in handles:
            if h.delta == cid:
                seen_tombstone |= pq.read_table(job.storage.path(h.path))["__deleted"].to_pylist().count(True) > 0
        seen_delta |= any(h.delta == cid for h in handles)
        seen_compaction |= any(f"chk-{cid}/" in h.path and "/compacted/" in h.path for h in handles)
        unread = step == len(sequence) or sequence[step] in ("restore", "restore savepoint")  # by a later step
        _check(job, truth, cid, spark=unread)
        _tables_match(tmp_path, truth, cid, list(stats))
        assert audit_job(job.storage, 3, job.graph.sinks) == []
        spark.conf.set("spark.sql.shuffle.partitions", "8")
    assert seen_delta and seen_compaction and seen_tombstone


def test_a_damaged_kept_file_fails_the_step_that_reads_it(spark, tmp_path):
    """Kept files are not re-hashed by the step: Parquet page checksums catch a flipped byte, the footer's
    Thrift a damaged footer. Either way the step fails with a StateFileError naming the file and the
    checkpoint that read it (on the driver's merge or in a Spark task, whichever reads it)."""
    rng = random.Random(SEED)
    job = make_job(spark, tmp_path, declare, inline_state_threshold=0)
    _land(tmp_path, rng, 2000, "e001.json")
    job.checkpoint()
    _land(tmp_path, rng, 50, "e002.json")
    second = job.checkpoint()
    full = [h for h in second.operators["views"].handles if h.delta is None and "chk-1/" in h.path]
    assert full and any(h.delta == 2 for h in second.operators["views"].handles)
    victim = Path(job.storage.path(full[0].path))
    good = victim.read_bytes()
    data = bytearray(good)
    data[len(data) // 3] ^= 0x55  # inside a data page (the footer is the file's end)
    victim.write_bytes(bytes(data))
    _land(tmp_path, rng, 50, "e003.json")
    with pytest.raises(StateFileError, match="(?i)checksum|crc|thrift|not Parquet") as page_damage:
        job.checkpoint()
    assert str(victim) in str(page_damage.value) and "checkpoint 3, " in str(page_damage.value)

    footer = int.from_bytes(good[-8:-4], "little")
    start = len(good) - 8 - footer
    data = bytearray(good)
    data[start : start + 16] = b"\xff" * 16  # the footer's first Thrift field headers: no valid type
    victim.write_bytes(bytes(data))
    JobRecordStore(job.storage).release_lease("run-3")  # as the failed run's finalize would
    with pytest.raises(StateFileError, match="(?i)thrift|not Parquet") as footer_damage:
        job.checkpoint()
    assert str(victim) in str(footer_damage.value) and "checkpoint 4, " in str(footer_damage.value)
