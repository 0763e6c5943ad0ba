"""A Delta upsert step into an existing table, in a fresh process as a step task runs it, imports neither pandas
nor ``pyarrow.dataset``/``pyarrow.acero``: pyarrow's ``to_numpy``/``pa.array``/``take`` of numpy indices import
pandas (0.3–0.6 s of a task), so the stage converts with :mod:`~airflow_provider_checkpoint.fileio.arrow_numpy`.
The table is read back with delta-rs and compared with pandas over the landed files (the later row per key)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
WATCHED = ("pandas", "pyarrow.dataset", "pyarrow.acero")

SCRIPT = """
import json, sys
from pathlib import Path

from airflow_provider_checkpoint.dataflow import DeltaTableSink, FileSource
from airflow_provider_checkpoint.spark.session import SparkHandle, embedded_conf, get_spark
from airflow_provider_checkpoint.testing.inprocess import make_job

base = Path(sys.argv[1])
WATCHED = json.loads(sys.argv[2])


def declare(base):
    rows = FileSource("rows", f"{base}/landing", "parquet", "user LONG, total LONG, label STRING")
    DeltaTableSink("upsert", rows, f"{base}/upsert", mode="upsert", keys=["user"], buckets=4)


job = make_job(SparkHandle(get_spark, embedded_conf(None)), base, declare)
job.checkpoint()
print(json.dumps(sorted(m for m in WATCHED if m in sys.modules)))
"""


def land(landing: Path, i: int, users: np.ndarray, rng: np.random.Generator) -> None:
    table = pa.table({"user": users, "total": rng.integers(0, 1000, len(users)), "label": [f"u{u}" for u in users]})
    pq.write_table(table, landing / f".rows-{i}")
    (landing / f".rows-{i}").rename(landing / f"rows-{i:03d}.parquet")


def test_an_upsert_step_in_a_fresh_process_imports_no_pandas(tmp_path: Path) -> None:
    from deltalake import DeltaTable

    rng = np.random.default_rng(7)
    landing = tmp_path / "landing"
    landing.mkdir()
    later = [rng.choice(3000, size, replace=False) for size in (400, 50)]
    for i, users in enumerate([np.arange(3000), *later], start=1):
        land(landing, i, users, rng)
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(tmp_path), json.dumps(WATCHED)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        if i > 1:  # the first creates the table (delta-rs)
            assert json.loads(done.stdout.strip().splitlines()[-1]) == [], done.stdout
    truth = pd.concat([pq.read_table(p).to_pandas() for p in sorted(landing.glob("rows-*.parquet"))])
    truth = truth.drop_duplicates("user", keep="last").sort_values("user").reset_index(drop=True)
    got = pa.table(DeltaTable(str(tmp_path / "upsert")).scan()).to_pandas()  # scan() applies deletion vectors
    got = got.astype({"label": object}).sort_values("user").reset_index(drop=True)
    pd.testing.assert_frame_equal(got[["user", "total", "label"]], truth[["user", "total", "label"]])
