"""A Delta upsert sink's stage prepared on a thread before the step reads its input (connectors/delta/prepared.py):
the same table as without it (a dict model, read by delta-rs), and another writer's commit after the preparation
refused as one after the stage is."""

from __future__ import annotations

import random
import threading
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from airflow_provider_checkpoint.connectors.delta import prepared as delta_prepared
from airflow_provider_checkpoint.dataflow import DeltaTableSink, FileSource
from airflow_provider_checkpoint.exceptions import SinkClaimedError
from airflow_provider_checkpoint.storage import JobStorage
from tests.spark.helpers import step_context

pytestmark = pytest.mark.spark

SOURCE = FileSource("src", "/nonexistent", "json", "x STRING")
SCHEMA = "a STRING, b LONG, v LONG"


def _rows(path: Any) -> dict[tuple[Any, ...], int]:
    got = pa.table(DeltaTable(str(path)).scan()).to_pylist()  # deletion vectors applied
    rows = {(r["a"], r["b"]): r["v"] for r in got}
    assert len(rows) == len(got), "a key appears twice"
    return rows


@pytest.mark.parametrize("seed", [3, 4])
def test_a_prepared_stage_gives_the_tables_a_dict_model_gives(spark, tmp_path, seed):
    """Random upserts and deletes of a compound key (nulls among its values), the stage prepared first; every
    third checkpoint finds instead a preparation another attempt of the previous checkpoint made before that
    one committed, which it must not take: delta-rs reads the model's rows after every checkpoint."""
    rng = random.Random(seed)
    space = [(a, b) for a in (None, "", "x", "y", "z") for b in (None, 1, 2, 3)]
    storage = JobStorage.for_job(str(tmp_path / "chk"), "job")
    path = tmp_path / "t"
    sink = DeltaTableSink("latest", SOURCE, str(path), "upsert", ["a", "b"], buckets=3, delete_when="gone")
    model: dict[tuple[Any, ...], int] = {}
    for checkpoint_id in range(1, 9):
        keys = space if checkpoint_id == 1 else rng.sample(space, rng.randint(1, 8))
        batch = [(a, b, checkpoint_id * 100 + i, checkpoint_id > 1 and i % 3 == 0) for i, (a, b) in enumerate(keys)]
        df = spark.createDataFrame(pd.DataFrame(batch, columns=["a", "b", "v", "gone"]), f"{SCHEMA}, gone BOOLEAN")
        ctx = step_context(spark, storage, checkpoint_id)
        if checkpoint_id % 3:
            sink.prepare(ctx)
        committables = sink.stage(ctx, df)
        if checkpoint_id % 3 == 2:  # never taken: of another attempt, and stale once this checkpoint commits
            sink.prepare(step_context(spark, storage, checkpoint_id, attempt=2))
        sink.commit(checkpoint_id, committables)
        for a, b, v, gone in batch:
            if gone:
                model.pop((a, b), None)
            else:
                model[(a, b)] = v
        assert _rows(path) == model, f"after checkpoint {checkpoint_id}"
    assert sink.audit() == []


def test_another_writers_commit_after_the_preparation_is_refused(spark, tmp_path):
    """delta-rs deletes a row after the stage was prepared: the stage drops the stale preparation and refuses the
    other writer's files as it does without one (the step fails, nothing is committed)."""
    storage = JobStorage.for_job(str(tmp_path / "chk"), "job")
    path = tmp_path / "t"
    sink = DeltaTableSink("latest", SOURCE, str(path), "upsert", ["a", "b"], buckets=2)
    base = pd.DataFrame({"a": [f"k{i}" for i in range(20)], "b": range(20), "v": range(20)})
    sink.commit(1, sink.stage(step_context(spark, storage, 1), spark.createDataFrame(base, SCHEMA)))
    ctx = step_context(spark, storage, 2)
    sink.prepare(ctx)
    assert all(t.daemon for t in threading.enumerate() if t.name == "delta-prepare")  # exit waits for none
    assert delta_prepared.take(sink, ctx) is not None  # prepared, and taken once
    sink.prepare(ctx)
    DeltaTable(str(path)).delete("a = 'k3'")  # another writer
    changed = pd.DataFrame({"a": ["k3", "k4"], "b": [3, 4], "v": [-3, -4]})
    with pytest.raises(SinkClaimedError, match="another writer"):
        sink.stage(ctx, spark.createDataFrame(changed, SCHEMA))
    assert DeltaTable(str(path)).version() == 2
    assert _rows(path) == {(f"k{i}", i): i for i in range(20) if i != 3}
