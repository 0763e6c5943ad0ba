"""Restoring incremental state on a real S3 server (SeaweedFS, every request logged): each file is
read once in all, the driver's checks and Spark's rows from the same GET, and the rows are those an
independent model of the overlay computes."""

from __future__ import annotations

import json
import random
import re
import uuid
from collections import Counter
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

from airflow_provider_checkpoint.state import spark_backend
from airflow_provider_checkpoint.state.files import write_state_file
from airflow_provider_checkpoint.state.handles import OperatorSnapshot, StateHandle
from airflow_provider_checkpoint.storage import JobStorage
from tests.servers.s3 import AccessLog, S3Server

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

GROUPS = 128
SCHEMA = json.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": "k", "type": "string", "nullable": True, "metadata": {}},
            {"name": "v", "type": "long", "nullable": True, "metadata": {}},
        ],
    }
)


def layers(seed: int) -> tuple[dict[str, int], list[list[tuple[str, int | None]]]]:
    """A full version and three checkpoints' changes: (key, new value), ``None`` deleting the key."""
    rng = random.Random(seed)
    keys = [f"u{i}" for i in range(60)]
    full = {k: rng.randrange(1000) for k in rng.sample(keys, 40)}

    def change() -> int | None:
        return None if rng.random() < 0.2 else rng.randrange(1000)

    changes = [[(k, change()) for k in rng.sample(keys, 15)] for _ in range(3)]
    return full, changes


def model(full: dict[str, int], changes: list[list[tuple[str, int | None]]]) -> dict[str, int]:
    state = dict(full)
    for layer in changes:
        for key, value in layer:
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
    return state


def snapshot(storage: JobStorage, seed: int) -> tuple[OperatorSnapshot, dict[str, int]]:
    full, changes = layers(seed)
    span = (0, GROUPS - 1)
    handles: list[StateHandle] = [
        write_state_file(storage, "chk-1/s/attempt-1/state/op/kgr=0/part-0.parquet", _rows(full), span)
    ]
    for checkpoint, layer in enumerate(changes, start=2):
        table = pa.table(
            {
                "k": [k for k, _ in layer],
                "v": pa.array([v for _, v in layer], pa.int64()),
                "__deleted": [v is None for _, v in layer],
                "__seq": pa.array([checkpoint] * len(layer), pa.int64()),
            }
        )
        relative = f"chk-{checkpoint}/s/attempt-1/state/op/delta/kgr=0/part-0.parquet"
        handles.append(write_state_file(storage, relative, table, span, delta=checkpoint))
    truth = model(full, changes)
    return OperatorSnapshot(tuple(handles), SCHEMA, ("k",), GROUPS, rows=len(truth)), truth


def _rows(values: dict[str, int]) -> pa.Table:
    return pa.table({"k": list(values), "v": pa.array(list(values.values()), pa.int64())})


def restored(spark: SparkSession, storage: JobStorage, state: OperatorSnapshot, access: AccessLog) -> Any:
    access.since()
    rows = {r["k"]: r["v"] for r in spark_backend.read_state(spark, storage, state, verify=True, uid="op").collect()}
    # the server may log the PUTs that wrote the files after the window opened: a read makes none
    return rows, Counter((r.kind, _directory(r.path)) for r in access.since() if r.kind != "PUT")


def _directory(path: str) -> str:
    """The checkpoint directory a request's object is in (``chk-N``), else its whole path."""
    found = re.search(r"/(chk-\d+)/", path)
    return found.group(1) if found else path


@pytest.mark.parametrize("seed", [1, 2])
def test_each_state_file_is_read_once_on_s3(
    spark: SparkSession, logged_s3: tuple[S3Server, AccessLog], monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """Restoring a full version and three deltas: one GET per file and no other request; with the
    files too big to ship in the plan, Spark's tasks read each again."""
    server, access = logged_s3
    storage = JobStorage.for_job(server.url(f"reads-{uuid.uuid4().hex[:8]}"), "job", **server.storage_options())
    state, truth = snapshot(storage, seed)
    directories = {f"chk-{c}" for c in range(1, 5)}

    rows, requests = restored(spark, storage, state, access)
    assert rows == truth
    assert requests == Counter({("GET", d): 1 for d in directories}), requests

    monkeypatch.setattr(spark_backend, "SHIPPED_BYTES", 0)
    rows, requests = restored(spark, storage, state, access)
    assert rows == truth
    assert requests == Counter({("GET", d): 2 for d in directories}), requests
