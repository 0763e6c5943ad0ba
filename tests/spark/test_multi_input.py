"""Multi-input operators over aligned barriers, checkpoint by checkpoint, against pandas ground truth.

Each checkpoint runs the real protocol in-process (coordinator trigger → Spark steps →
finalize) over real files. Files landed on any input *after* the trigger cut the barrier
belong to the next checkpoint; the truth is computed with pandas over each aligned cut.
"""

from __future__ import annotations

import random
from pathlib import Path

import pandas as pd
import pytest

from airflow_provider_checkpoint.dataflow import (
    FileSource,
    IntervalJoin,
    ParquetTableSink,
)
from airflow_provider_checkpoint.restore.requests import request_restore
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore
from airflow_provider_checkpoint.testing.inprocess import T0, make_job
from tests.spark.helpers import table, write_json
from tests.spark.orders import Landing, assert_equal, changes, enrichment_pipeline

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("on_missing", ["emit", "hold"])
def test_enrichment_over_aligned_cuts(spark, tmp_path, on_missing):
    job = make_job(spark, tmp_path, enrichment_pipeline(on_missing))
    landing = Landing(tmp_path, seed=7)
    landing.land(1, 40, changes(("c0", "gold", 1, "U"), ("c1", "silver", 1, "U"), ("c2", "bronze", 1, "U")))
    job.checkpoint(during=lambda: landing.land(2, 30, changes(("c3", "gold", 2, "U"), ("c0", "platinum", 2, "U"))))
    # an update and facts of the same key in one checkpoint: the facts see the update
    landing.land(2, 20, changes(("c1", "gold", 3, "U"), ("c2", "x", 3, "D"), ("c4", "new", 3, "U")))
    job.checkpoint(during=lambda: landing.land(3, 25, changes(("c2", "back", 4, "U"), ("c0", "stale", 1, "U"))))
    job.checkpoint()
    landing.land(4, 15, changes(("c5", "late", 5, "U")))
    job.checkpoint()
    job.checkpoint()  # nothing new: held orders of c6, c7 expire (ttl 250 s = 2.5 checkpoints)
    job.checkpoint()
    want = landing.truth(job.checkpoints, on_missing, ttl_checkpoints=3)
    assert_equal(table(tmp_path / "marts" / "enriched"), want, ["order_id"])
    if on_missing == "hold":
        assert want["segment"].isna().sum() > 0, "the data must exercise expiry"
        assert (want["segment"] == "late").sum() > 0, "the data must exercise a held fact found later"


# -- interval join ---------------------------------------------------------------------------


def join_pipeline(tmp: Path) -> None:
    clicks = FileSource("clicks", str(tmp / "clicks"), "json", "user STRING, click_ts LONG, ad STRING")
    buys = FileSource("buys", str(tmp / "buys"), "json", "user STRING, buy_ts LONG, amount LONG")
    joined = IntervalJoin("attributed", clicks, buys, ["user"], "click_ts", "buy_ts", 0, 10, out_of_orderness=5)
    ParquetTableSink("attributions", joined, str(tmp / "marts" / "attributions"), mode="append")


def land_join(tmp: Path, n: int, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Increment ``n``: event times in [100n, 100n + 100) on both sides."""
    rng = random.Random(seed)
    clicks = [
        {"user": f"u{rng.randrange(6)}", "click_ts": 100 * n + rng.randrange(100), "ad": f"a{i}"} for i in range(40)
    ]
    buys = [{"user": f"u{rng.randrange(6)}", "buy_ts": 100 * n + rng.randrange(100), "amount": i} for i in range(30)]
    write_json(tmp / "clicks" / f"c{n}.json", clicks)
    write_json(tmp / "buys" / f"b{n}.json", buys)
    return pd.DataFrame(clicks), pd.DataFrame(buys)


def join_truth(clicks: pd.DataFrame, buys: pd.DataFrame) -> pd.DataFrame:
    pairs = clicks.merge(buys, on="user")
    return pairs[(pairs.buy_ts >= pairs.click_ts) & (pairs.buy_ts <= pairs.click_ts + 10)]


def test_interval_join_with_restore_and_rescaling(spark, tmp_path):
    (tmp_path / "clicks").mkdir()
    (tmp_path / "buys").mkdir()
    job = make_job(spark, tmp_path, join_pipeline)
    landed = []
    for n in range(1, 4):
        landed.append(land_join(tmp_path, n, seed=n))
        job.checkpoint()
    state_rows = CompletedCheckpointStore(job.storage).load(3).operators["attributed"].rows
    assert state_rows < sum(len(c) + len(b) for c, b in landed), "expired rows must leave the state"

    # restore checkpoint 1 and replay with another parallelism: same output as one batch over all input
    request_restore(job.storage, job.storage.url("chk-1"), False, False)
    previous = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "3")
    try:
        landed.append(land_join(tmp_path, 4, seed=4))
        job.checkpoint()
        job.checkpoint()
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", previous)
    clicks = pd.concat([c for c, _ in landed])
    buys = pd.concat([b for _, b in landed])
    want = join_truth(clicks, buys)
    assert len(want) > 20, "the data must produce matches, also across increments"
    assert_equal(table(tmp_path / "marts" / "attributions"), want, ["ad", "amount", "user"])


def test_a_source_that_cannot_cut_its_barrier_triggers_nothing(spark, tmp_path):
    (tmp_path / "clicks").mkdir()
    job = make_job(spark, tmp_path, join_pipeline)  # buys/ is missing: its barrier cannot be cut
    with pytest.raises(FileNotFoundError, match="buys"):
        job.coordinator.trigger("run-1", now=T0)
    assert job.storage.checkpoint_ids() == [] and not job.storage.exists("_lease")
