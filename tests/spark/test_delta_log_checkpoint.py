"""The sink's own Delta log checkpoints (connectors/delta/log_checkpoint.py) against delta-rs's
``create_checkpoint`` of the same version, and read by readers we did not write from the checkpoint alone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_checkpoint.connectors.delta import upsert as delta_upsert
from airflow_provider_checkpoint.dataflow import DeltaSource, DeltaTableSink
from airflow_provider_checkpoint.storage import JobStorage
from tests.spark.helpers import step_context
from tests.spark.test_delta_sink import SOURCE, _batch, _duckdb, _sorted

pytestmark = pytest.mark.spark


def _log(path: Path) -> Path:
    return path / "_delta_log"


def _copy(path: Path, to: Path, keep: Any) -> Path:
    """``path`` copied to ``to`` with only the log files ``keep(name)`` accepts."""
    shutil.copytree(path, to)
    for f in _log(to).iterdir():
        if not keep(f.name):
            f.unlink()
    return to


def _version(name: str) -> int:
    return int(name.split(".")[0]) if name[:1].isdigit() else -1


def _rows(checkpoint: Path) -> list[str]:
    """A checkpoint's actions, one JSON text each (maps as sorted pairs), sorted."""
    out = []
    for row in pq.read_table(checkpoint).to_pylist():
        for kind, action in row.items():
            if action is not None:
                out.append(json.dumps({kind: action}, sort_keys=True, default=str))
    return sorted(out)


def _parquet_schema(checkpoint: Path) -> list[str]:
    """The Parquet schema, field by field (repetition, physical and logical type), the root's name aside."""
    return str(pq.ParquetFile(checkpoint).schema).splitlines()[2:]


def _scan(path: Path, version: int | None = None) -> pd.DataFrame:
    from deltalake import DeltaTable

    return pa.table(DeltaTable(str(path), version=version).scan()).to_pandas()


def _tables(spark: Any, tmp_path: Path, monkeypatch: Any) -> dict[str, tuple[Path, pd.DataFrame]]:
    """An append table (partitioned, another writer's commit among the sink's) and an upsert table with
    deletion vectors inline and in DV files, after several checkpoints; each with its rows."""
    from deltalake import write_deltalake

    monkeypatch.setattr(delta_upsert, "INLINE_DV_BYTES", 40)  # some DVs in DV files
    storage = JobStorage.for_job(str(tmp_path / "chk"), "job")
    events, latest = tmp_path / "events", tmp_path / "latest"
    appended = DeltaTableSink("events", SOURCE, str(events), partition_by=["region"])
    upserted = DeltaTableSink("latest", SOURCE, str(latest), "upsert", ["k"], buckets=2, inline_deletion_vectors=True)
    base = pd.DataFrame({"k": [f"k{i}" for i in range(300)], "region": "eu", "v": range(300)})
    rows, truth = [], base
    upserted.commit(1, upserted.stage(step_context(spark, storage, 1), spark.createDataFrame(base)))
    for checkpoint_id in range(1, 7):
        batch = _batch(checkpoint_id)
        appended.commit(
            checkpoint_id, appended.stage(step_context(spark, storage, checkpoint_id), spark.createDataFrame(batch))
        )
        rows.append(batch)
        if checkpoint_id == 3:
            other = pd.DataFrame({"k": ["other"], "region": ["eu"], "v": [-1]})
            write_deltalake(str(events), other, mode="append", partition_by=["region"])  # another writer
            rows.append(other)
        if checkpoint_id > 1:
            keys = [f"k{(checkpoint_id * 37 + i * 11) % 300}" for i in range(checkpoint_id * 3)]
            changed = pd.DataFrame({"k": keys, "region": "us/west", "v": [-checkpoint_id] * len(keys)})
            changed = changed.drop_duplicates("k")
            ctx = step_context(spark, storage, checkpoint_id)
            (staged,) = upserted.stage(ctx, spark.createDataFrame(changed))
            assert checkpoint_id == 2 or staged["deletes"], "an upsert of a few keys gives files deletion vectors"
            upserted.commit(checkpoint_id, [staged])
            truth = pd.concat([truth[~truth.k.isin(changed.k)], changed])
    return {"events": (events, pd.concat(rows)), "latest": (latest, truth)}


def test_our_log_checkpoints_are_delta_rs_s_and_readers_read_the_table_from_them(spark, tmp_path, monkeypatch):
    """Every version the sink committed has our checkpoint: the same Parquet schema and the same actions
    as delta-rs's ``create_checkpoint`` of that version (from the JSON commits alone); delta-rs (latest
    and time travel), DuckDB and the provider's own reader read each table from our checkpoint with every
    commit before it deleted."""
    from deltalake import DeltaTable

    for name, (path, truth) in _tables(spark, tmp_path, monkeypatch).items():
        log = sorted(f.name for f in _log(path).iterdir())
        ours = sorted(_version(n) for n in log if n.endswith(".checkpoint.parquet"))
        commits = sorted(_version(n) for n in log if n.endswith(".json"))
        written_by_us = [
            v for v in commits if "airflow-provider-checkpoint" in (_log(path) / f"{v:020d}.json").read_text()
        ]
        assert ours == written_by_us and len(ours) >= 6, name
        with_dvs = 0
        for v in ours:
            reference = _copy(
                path, tmp_path / f"{name}-ref-{v}", lambda n, v=v: n.endswith(".json") and _version(n) <= v
            )
            DeltaTable(str(reference)).create_checkpoint()
            theirs = _log(reference) / f"{v:020d}.checkpoint.parquet"
            mine = _log(path) / f"{v:020d}.checkpoint.parquet"
            assert _parquet_schema(mine) == _parquet_schema(theirs), (name, v)
            assert pq.read_schema(mine).remove_metadata() == pq.read_schema(theirs).remove_metadata(), (name, v)
            assert _rows(mine) == _rows(theirs), (name, v)
            with_dvs += any('"deletionVector": {' in r and r.startswith('{"add"') for r in _rows(mine))
            mine_last = json.loads((_log(path) / "_last_checkpoint").read_text()) if v == ours[-1] else None
            if mine_last is not None:
                theirs_last = json.loads((_log(reference) / "_last_checkpoint").read_text())
                assert mine_last.pop("sizeInBytes") == mine.stat().st_size  # Parquet encoders differ in size
                assert mine_last == {k: theirs_last[k] for k in theirs_last if k != "sizeInBytes"}, name
            # time travel to v from our checkpoint alone: the commits up to v and the other checkpoints deleted
            alone = _copy(
                path,
                tmp_path / f"{name}-alone-{v}",
                lambda n, v=v: n == f"{v:020d}.checkpoint.parquet" or (n.endswith(".json") and _version(n) > v),
            )
            expected = _sorted(_scan(reference), ["k", "v"])
            pd.testing.assert_frame_equal(_sorted(_scan(alone, v), ["k", "v"]), expected, obj=f"{name} at {v}")
        every = [json.loads(r) for v in ours for r in _rows(_log(path) / f"{v:020d}.checkpoint.parquet")]
        kinds = {(k, (a[k].get("deletionVector") or {}).get("storageType")) for a in every for k in a}
        if name == "latest":  # adds and tombstones with DVs inline and in DV files
            assert with_dvs >= 3 and {("add", "i"), ("add", "u"), ("remove", "i"), ("remove", None)} <= kinds, kinds
        assert {"protocol", "metaData", "txn", "add"} <= {k for k, _ in kinds}, kinds
        # the latest version: our checkpoint and _last_checkpoint, no commit before it
        latest = ours[-1]
        only = _copy(
            path,
            tmp_path / f"{name}-only",
            lambda n, latest=latest: (
                n in (f"{latest:020d}.checkpoint.parquet", "_last_checkpoint") or _version(n) > latest
            ),
        )
        assert not [n for n in (f.name for f in _log(only).iterdir()) if n.endswith(".json")]
        table = DeltaTable(str(only))
        assert table.version() == latest
        got = {
            "delta-rs scan()": _scan(only),
            "delta-rs to_pyarrow_table()": table.to_pyarrow_table().to_pandas() if name == "events" else None,
            "duckdb delta_scan": _duckdb(only),
            "DeltaSource": DeltaSource("read", str(only)).read_version(spark).toPandas(),
        }
        for reader, df in got.items():
            if df is not None:
                pd.testing.assert_frame_equal(
                    _sorted(df, ["k", "v"]), _sorted(truth, ["k", "v"]), check_dtype=False, obj=f"{name}: {reader}"
                )
