"""The two workloads' data: deterministic increments of click events, landed atomically.

``clickstream``: every increment has ``events`` events over ``users`` users (most users change
each increment). ``large-state``: increment 1 holds every one of ``users`` keys once (the state
is built), every later increment ``events`` events over random keys (a small share changes).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from bench.measure import MB, elapsed, log

SCHEMA = "user STRING, page STRING, ts LONG"
AGGS = {"events": "count", "first_seen": "min(ts)", "last_seen": "max(ts)"}
COLUMNS = ["user", "events", "first_seen", "last_seen"]
TS0 = 1_700_000_000_000
WORKLOADS = ("clickstream", "large-state")


@dataclass(frozen=True)
class DataSpec:
    workload: str
    increments: int
    events: int
    users: int
    pages: int
    seed: int

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r}: expected one of {', '.join(WORKLOADS)}")

    def size(self, i: int) -> int:
        """Events in increment ``i``: the full key set first for ``large-state``."""
        return self.users if self.workload == "large-state" and i == 1 else self.events

    def increment(self, i: int) -> pd.DataFrame:
        """The events of increment ``i`` (1-based); deterministic in (seed, i)."""
        rng = np.random.default_rng([self.seed, i])
        n = self.size(i)
        width = max(6, len(str(self.users - 1)))
        full = self.workload == "large-state" and i == 1
        keys = np.arange(self.users) if full else rng.integers(0, self.users, n)
        users = np.char.add("u", np.char.zfill(keys.astype(str), width)).astype(object)
        pages = np.char.add("p", np.char.zfill(rng.integers(0, self.pages, n).astype(str), 4)).astype(object)
        # timestamps rise across increments, with jitter so min/max are not the first/last row
        base = TS0 + (i - 1) * 10_000_000_000 + np.arange(n, dtype=np.int64) * 10
        return pd.DataFrame({"user": users, "page": pages, "ts": base + rng.integers(0, 50_000, n)})


def generate(data_dir: Path, spec: DataSpec) -> list[Path]:
    """Write every increment once as JSON Lines; reused while the spec is unchanged."""
    files = [data_dir / f"events-{i:04d}.json" for i in range(1, spec.increments + 1)]
    manifest = data_dir / "manifest.json"
    if manifest.exists() and json.loads(manifest.read_text()) == asdict(spec) and all(f.exists() for f in files):
        log(f"data: reusing {len(files)} increments in {data_dir}")
        return files
    if data_dir.exists():
        shutil.rmtree(data_dir)
    data_dir.mkdir(parents=True)
    started = time.perf_counter()
    for i, path in enumerate(files, start=1):
        spec.increment(i).to_json(path, orient="records", lines=True)
    manifest.write_text(json.dumps(asdict(spec)))
    size = sum(f.stat().st_size for f in files)
    log(f"data: generated {len(files)} increments ({size / MB:.1f} MB) in {elapsed(started):.1f}s")
    return files


def land(data_file: Path, landing: Path) -> None:
    """Copy under a hidden name, then rename: no reader ever sees a partial file."""
    landing.mkdir(parents=True, exist_ok=True)
    hidden = landing / f".{data_file.name}.inflight"
    shutil.copyfile(data_file, hidden)
    os.rename(hidden, landing / data_file.name)


def ground_truth(events: pd.DataFrame) -> pd.DataFrame:
    """The expected table, computed by pandas over all input."""
    truth = (
        events.groupby("user")
        .agg(events=("ts", "size"), first_seen=("ts", "min"), last_seen=("ts", "max"))
        .reset_index()
    )
    return normalized(truth)


def normalized(df: pd.DataFrame) -> pd.DataFrame:
    df = df[COLUMNS].astype({"user": str, "events": "int64", "first_seen": "int64", "last_seen": "int64"})
    return df.sort_values("user").reset_index(drop=True)


def read_parquet_dir(path: Path) -> pd.DataFrame:
    """What a plain reader sees: pyarrow over the directory (files starting with _ or . ignored)."""
    import pyarrow.dataset as ds

    return ds.dataset(os.path.realpath(path), format="parquet").to_table().to_pandas()
