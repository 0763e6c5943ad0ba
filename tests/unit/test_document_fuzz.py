"""Seeded mutation fuzzing of every decoder of a stored or passed-on document.

Each round mutates a valid document (bytes flipped, a node replaced by random JSON, a
wrong type, a huge or non-finite number, deep nesting, or a path trick aimed at a canary
directory), decodes it, and — when it decodes — uses it the way the provider does
(verify state handles, commit and roll back sink output, delete an attempt directory).
Only the documented error types may come out, and the canary directory outside every
root must be byte-for-byte unchanged. Reproduce a failure with ``FUZZ_SEED=<seed>``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_checkpoint.connectors.files.parquet_sink import ParquetTableSink
from airflow_provider_checkpoint.core import metadata
from airflow_provider_checkpoint.core.documents import load_json
from airflow_provider_checkpoint.core.job_record import JobRecord
from airflow_provider_checkpoint.core.model import (
    Ack,
    Barrier,
    CheckpointPlan,
    CheckpointType,
    CompletedCheckpoint,
    RestorePoint,
    RestoreRequest,
)
from airflow_provider_checkpoint.dataflow.graph import Source
from airflow_provider_checkpoint.exceptions import (
    CheckpointStorageError,
    DocumentError,
    PipelineDefinitionError,
    UnsafePathError,
)
from airflow_provider_checkpoint.restore.snapshot import Snapshot
from airflow_provider_checkpoint.state.handles import OperatorSnapshot
from airflow_provider_checkpoint.storage import JobStorage
from tests.unit.state_files import SCHEMA, state_file

SEED = int(os.environ.get("FUZZ_SEED", "20261122"))
ROUNDS = 300
DOCUMENTED = (DocumentError, UnsafePathError, CheckpointStorageError, PipelineDefinitionError)
JOB = "fuzzjob"
STATE = state_file("state")


def tree_state(root: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def roots(tmp_path: Path) -> dict[str, Path]:
    canary = tmp_path / "canary"
    (canary / "sub").mkdir(parents=True)
    (canary / "secret.parquet").write_bytes(b"canary data")
    (canary / "sub" / "part-c0000000003-00000.parquet").write_bytes(b"canary part")
    work = tmp_path / "work"
    for attempt in (1, 2):  # attempt 1: the checkpoint's state; attempt 2: the fuzzed ack's
        state = (
            work / "ckpt" / JOB / "chk-3" / "step_a" / f"attempt-{attempt}" / "state" / "counts" / "kgr=0" / "p.parquet"
        )
        state.parent.mkdir(parents=True)
        state.write_bytes(STATE)
    table = work / "table"
    (table / "_staging" / "chk-3").mkdir(parents=True)
    (table / "_staging" / "chk-3" / "f.parquet").write_bytes(b"staged")
    (table / "_commits").mkdir()
    return {"canary": canary, "work": work, "table": table}


def valid_documents(canary: Path) -> dict[str, Any]:
    checksum = "sha256:" + hashlib.sha256(STATE).hexdigest()
    handle = {"path": "chk-3/step_a/attempt-1/state/counts/kgr=0/p.parquet", "size": len(STATE), "checksum": checksum}
    operators = {"counts": {"handles": [handle], "schema": SCHEMA, "keys": ["k"], "max_parallelism": 128, "rows": 1}}
    moves = [["_staging/chk-3/f.parquet", "part-c0000000003-00000.parquet"]]
    sinks = {"table": [{"checkpoint_id": 3, "moves": moves}]}
    barrier = Barrier(3, 1.0, CheckpointType.CHECKPOINT, {"events": {"files": {"a.json": 1}}})
    checkpoint = CompletedCheckpoint(
        JOB,
        3,
        CheckpointType.CHECKPOINT,
        1.0,
        2.0,
        None,
        barrier,
        {"counts": OperatorSnapshot.from_dict(operators["counts"], "t", "operators.counts", _scope(), "counts")},
        sinks,
        options={"savepoint_target": f"file://{canary}/sp"},
    )
    restore_point = RestorePoint(2, "file:///x/chk-2", {"events": {"files": {}}}, {}, None)
    plan = CheckpointPlan(JOB, "manual__1", Barrier(3, 1.0, CheckpointType.CHECKPOINT, {}), ("step_a",), 60.0)
    return {
        "metadata": json.loads(metadata.encode(checkpoint)),
        "job": json.loads(JobRecord(JOB, {"nodes": {"counts": {"kind": "stateful"}}}, last_checkpoint_id=3).encode()),
        "plan": {**plan.to_dict(), "restore_point": restore_point.to_dict()},
        "restore": RestoreRequest("a" * 32, f"file://{canary}", 2, False, 1.0).to_dict(),
        "claim": {"job_id": JOB, "sink": "table", "mode": "append", "keys": []},
        "commit_log": {"checkpoint_id": 3, "files": ["part-c0000000003-00000.parquet"]},
        "ack": {
            "job_id": JOB,
            "checkpoint_id": 3,
            "step": "step_a",
            "attempt": 2,
            "attempt_dir": "chk-3/step_a/attempt-2",
            "operators": json.loads(json.dumps(operators).replace("attempt-1", "attempt-2")),
            "sinks": sinks,
            "metrics": {},
        },
    }


def _scope() -> Any:
    from airflow_provider_checkpoint.state.handles import HandleScope

    return HandleScope(3)


def path_tricks(canary: Path) -> list[Any]:
    return [
        "../canary/secret.parquet",
        "../../canary",
        "chk-3/../../../canary/secret.parquet",
        "_staging/chk-3/../../../canary/secret.parquet",
        "_staging/chk-3/link.parquet",
        str(canary / "secret.parquet"),
        f"file://{canary}/secret.parquet",
        "s3://bucket/key",
        "a\\b",
        "a\nb",
        "chk-3//x",
        "./x",
        "",
        "%2e%2e/canary",
        "part-c0000000003-00000.parquet/../../canary",
        "sub/part-c0000000003-00000.parquet",
    ]


def random_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 4 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 1, 2**63, 2**70, -(2**63), 3])
    if kind == 3:
        return rng.choice([0.5, -1.5, 1e308, float("inf"), float("nan")])
    if kind == 4:
        return rng.choice(["", "x", "chk-3", "RUNNING", "savepoint", "x" * 5000, "\x00"])
    if kind == 5:
        return rng.choice([[], {}, [1, 2], {"a": 1}])
    if kind == 6:
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(3))]
    return {rng.choice(["path", "moves", "files", "handles", "x"]): random_json(rng, depth + 1)}


def nodes(doc: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += nodes(v, (*at, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += nodes(v, (*at, i))
    return out


def replace(doc: Any, at: tuple[Any, ...], value: Any) -> Any:
    if not at:
        return value
    doc[at[0]] = replace(doc[at[0]], at[1:], value)
    return doc


def mutate(rng: random.Random, doc: Any, tricks: list[Any]) -> bytes:
    choice = rng.randrange(6)
    if choice == 0:  # byte-level damage
        data = bytearray(json.dumps(doc).encode())
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)
    if choice == 1:  # deep nesting
        return b"[" * 100_000 + b"]" * 100_000
    if choice == 2:  # a huge number literal
        return json.dumps(doc).replace("3", "9" * 5000, 1).encode()
    doc = copy.deepcopy(doc)
    at = rng.choice(nodes(doc))
    if choice == 3:  # a path trick in place of a string: where the paths are
        at = rng.choice([n for n in nodes(doc) if isinstance(_get(doc, n), str)])
        doc = replace(doc, at, rng.choice(tricks))
    elif choice == 4:
        doc = replace(doc, at, random_json(rng))
    elif at and isinstance(parent := _get(doc, at[:-1]), dict):
        del parent[at[-1]]
    return json.dumps(doc, allow_nan=True).encode()


def _get(doc: Any, at: tuple[Any, ...]) -> Any:
    for k in at:
        doc = doc[k]
    return doc


def test_fuzzed_documents_give_documented_errors_and_never_touch_the_canary(roots: dict[str, Path]) -> None:
    canary, work, table = roots["canary"], roots["work"], roots["table"]
    before = tree_state(canary)
    storage = JobStorage.for_job(f"file://{work}/ckpt", JOB)
    sink = ParquetTableSink("table", Source("events"), str(table))

    def use_metadata(data: bytes) -> None:
        cp = metadata.decode(data, "fuzzed _metadata")
        Snapshot(cp, storage.checkpoint_location(3), storage).verify()
        for uid, committables in cp.sinks.items():
            if uid == "table":
                sink.commit(cp.checkpoint_id, committables)
                sink.rollback(0)

    def use_ack(data: bytes) -> None:
        ack = Ack.from_dict(load_json(data, "fuzzed ack"), "fuzzed ack")
        attempt_file = work / "ckpt" / JOB / "chk-3/step_a/attempt-2/state/counts/kgr=0/p.parquet"
        attempt_file.parent.mkdir(parents=True, exist_ok=True)
        attempt_file.write_bytes(STATE)
        for state in ack.operators.values():
            for handle in state.handles:
                storage.verify(handle)
        storage.delete(ack.attempt_dir)
        for committables in ack.sinks.values():
            sink.commit(ack.checkpoint_id, committables)

    def use_claim(data: bytes) -> None:
        (table / "_table.json").write_bytes(data)
        sink.claim(JOB)

    def use_commit_log(data: bytes) -> None:
        (table / "_commits" / "0000000003.json").write_bytes(data)
        sink.rollback(0)

    decoders: dict[str, Callable[[bytes], Any]] = {
        "metadata": use_metadata,
        "job": lambda data: JobRecord.decode(data, "fuzzed _job.json"),
        "plan": lambda data: CheckpointPlan.from_dict(load_json(data, "fuzzed plan"), "fuzzed plan"),
        "restore": lambda data: RestoreRequest.from_dict(load_json(data, "fuzzed request"), "fuzzed request"),
        "claim": use_claim,
        "commit_log": use_commit_log,
        "ack": use_ack,
    }
    documents = valid_documents(canary)
    for name, use in decoders.items():  # the unmutated documents are valid and usable
        use(json.dumps(documents[name]).encode())
    # then a link in the staging that leads to the canary: any commit of that staging is refused
    (table / "_staging" / "chk-3").mkdir(parents=True, exist_ok=True)
    (table / "_staging" / "chk-3" / "link.parquet").symlink_to(canary / "secret.parquet")
    tricks = path_tricks(canary)
    rng = random.Random(SEED)
    outcomes: dict[str, dict[str, int]] = {name: {"ok": 0, "refused": 0} for name in decoders}
    for round_no in range(ROUNDS):
        for name, use in decoders.items():
            data = mutate(rng, documents[name], tricks)
            try:
                use(data)
                outcomes[name]["ok"] += 1
            except DOCUMENTED:
                outcomes[name]["refused"] += 1
            except Exception as e:  # noqa: BLE001 - any other type is the failure under test
                pytest.fail(
                    f"seed {SEED} round {round_no} {name}: undocumented {type(e).__name__}: {e}\n{data[:300]!r}"
                )
    assert tree_state(canary) == before, f"seed {SEED}: the canary directory changed"
    for name, counts in outcomes.items():
        assert counts["refused"] > ROUNDS // 4, f"{name}: the fuzzer hardly exercised refusals ({counts})"
