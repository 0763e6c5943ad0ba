"""The Delta upsert writer checks what it commits (issue #30): crafted bad versions are refused and
nothing is written to ``_delta_log`` (no Spark, no delta-rs: a hand-written log)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_checkpoint.connectors.base.bucket_merge import KeySet
from airflow_provider_checkpoint.connectors.delta import checks as delta_checks
from airflow_provider_checkpoint.connectors.delta import commit as delta_commit
from airflow_provider_checkpoint.connectors.delta import deletion_vectors as dv
from airflow_provider_checkpoint.connectors.delta import log as delta_log
from airflow_provider_checkpoint.connectors.delta.files import DeltaCommit, DeltaDeletes
from airflow_provider_checkpoint.exceptions import DocumentError

LOCAL = fsspec.filesystem("file")
BUCKET = "chk-1/job/step/attempt-1/part-b00000.parquet"
UPDATE = "chk-2/job/step/attempt-1/part-u0000000002-00000.parquet"
OLD = dv.inline(np.array([1, 2], dtype=np.uint64))  # the bucket file's DV in the table


def _add(path: str, size: int, records: int, deletion_vector: dv.Descriptor | None = None) -> dict[str, Any]:
    add = {"path": path, "partitionValues": {}, "size": size, "dataChange": True, "modificationTime": 1}
    add["stats"] = json.dumps({"numRecords": records})
    return {"add": {**add, "deletionVector": deletion_vector.to_json()}} if deletion_vector else {"add": add}


def _table(tmp_path: Path) -> str:
    """A table whose version 0 holds the bucket file (10 rows, rows 1 and 2 deleted) and an update file."""
    log = tmp_path / "t" / "_delta_log"
    log.mkdir(parents=True)
    actions = [
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7}},
        _add(BUCKET, 900, 10, OLD),
        _add(UPDATE, 700, 2),
    ]
    (log / f"{0:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))
    return str(tmp_path / "t")


def _commit(root: str, changes: DeltaCommit) -> int | None:
    done = delta_commit.commit(LOCAL, root, "t", "app", 2, changes, "committables", since=0)
    return done.version if done else None


def _deletes(new: dv.Descriptor, **kwargs: Any) -> DeltaCommit:
    return DeltaCommit(
        [], [], [DeltaDeletes(**{"path": BUCKET, "size": 900, "num_records": 10, "old": OLD, "new": new, **kwargs})]
    )


def test_a_good_version_commits(tmp_path):
    root = _table(tmp_path)
    assert _commit(root, _deletes(dv.inline(np.array([1, 2, 7], dtype=np.uint64)))) == 1
    live = delta_log.snapshot(LOCAL, root, "t")
    assert live[BUCKET].deletion_vector is not None and live[BUCKET].deletion_vector.cardinality == 3


def _wrong_cardinality() -> dv.Descriptor:
    right = dv.inline(np.array([1, 2, 3], dtype=np.uint64))
    return dv.Descriptor("i", right.path_or_inline, None, right.size, 4)


BAD_DELETES: dict[str, tuple[dict[str, Any], str]] = {
    # issue #30 defect 1: the "new" DV is the old one
    "same DV": ({"new": OLD}, "removed and re-added with the same deletion vector"),
    "fewer rows": ({"new": dv.inline(np.array([1, 5], dtype=np.uint64))}, r"brings back 1 row\(s\)"),
    "no new row": ({"new": dv.inline(np.array([2, 1], dtype=np.uint64)[::-1].copy())}, "same deletion vector"),
    "row past the file": ({"new": dv.inline(np.array([1, 2, 10], dtype=np.uint64))}, "deletes row 10, but the file"),
    "cardinality": ({"new": _wrong_cardinality()}, "names 3 rows, not its cardinality"),
    "size": ({"new": dv.inline(np.array([1, 2, 3], dtype=np.uint64)), "size": 901}, "size 901, not its 900"),
    "records": ({"new": dv.inline(np.array([1, 2, 3], dtype=np.uint64)), "num_records": 11}, "11 records, not its 10"),
}


@pytest.mark.parametrize("case", sorted(BAD_DELETES))
def test_a_bad_deletion_vector_is_refused_and_nothing_committed(tmp_path, case):
    root = _table(tmp_path)
    change, message = BAD_DELETES[case]
    with pytest.raises(DocumentError, match=message) as refused:
        _commit(root, _deletes(**change))
    assert "Delta table t, version 1 (checkpoint 2)" in str(refused.value) and "nothing written" in str(refused.value)
    assert sorted(p.name for p in (Path(root) / "_delta_log").iterdir()) == [f"{0:020d}.json"]


def test_a_dv_in_a_file_must_decode(tmp_path):
    root = _table(tmp_path)
    stored, path = dv.new_descriptor_path("chk-2/job/step/attempt-1")
    Path(root, path).parent.mkdir(parents=True)
    (good,) = dv.write_file(LOCAL, f"{root}/{path}", stored, [np.array([1, 2, 3], dtype=np.uint64)])
    data = bytearray(Path(root, path).read_bytes())
    data[-5] ^= 0xFF  # a flipped bit of the bitmap
    Path(root, path).write_bytes(bytes(data))
    with pytest.raises(DocumentError, match="fails its checksum"):
        _commit(root, _deletes(good))
    assert len(list((Path(root) / "_delta_log").iterdir())) == 1


def _check(*actions: dict[str, Any], live: dict[Any, Any] | None = None) -> None:
    table = (
        live if live is not None else {(BUCKET, delta_log.dv_id(OLD.to_json())): (0, _add(BUCKET, 900, 10, OLD)["add"])}
    )
    delta_checks.check_version(
        "v",
        list(actions),
        table,
        lambda d, where: dv.read_positions(LOCAL, "/nowhere", dv.read_descriptor(_fields(d)), where),
    )


def _fields(raw: Any) -> Any:
    from airflow_provider_checkpoint.core.documents import Fields

    return Fields(raw, "dv")


def _remove(path: str, descriptor: dv.Descriptor | None = None) -> dict[str, Any]:
    remove: dict[str, Any] = {"path": path, "size": 900, "dataChange": True}
    return {"remove": {**remove, "deletionVector": descriptor.to_json()}} if descriptor else {"remove": remove}


NEW = dv.inline(np.array([1, 2, 3], dtype=np.uint64))
BAD_VERSIONS: dict[str, tuple[list[dict[str, Any]], str]] = {
    "added twice": ([_remove(BUCKET, OLD), _add(BUCKET, 900, 10, NEW), _add(BUCKET, 900, 10, NEW)], "added twice"),
    "removed twice": ([_remove(BUCKET, OLD), _remove(BUCKET, OLD)], "removed twice"),
    "stale remove": ([_remove(BUCKET, NEW), _add(BUCKET, 900, 10, OLD)], "does not hold live"),
    "remove of a file not in the table": ([_remove(UPDATE, OLD), _add(UPDATE, 700, 2, NEW)], "does not hold live"),
    "re-added without its remove": ([_add(BUCKET, 900, 10, NEW)], "without a remove of its live entry"),
    "new file with a DV": ([_add(UPDATE, 700, 2, NEW)], "new to the table but comes with a deletion vector"),
    "no numRecords": (
        [_remove(BUCKET, OLD), {"add": {**_add(BUCKET, 900, 10, NEW)["add"], "stats": None}}],
        "numRecords",
    ),
    "no path": ([{"add": {"size": 3}}], "has no path"),
}


@pytest.mark.parametrize("case", sorted(BAD_VERSIONS))
def test_the_delta_protocols_rules_for_file_actions(case):
    actions, message = BAD_VERSIONS[case]
    with pytest.raises(DocumentError, match=message):
        _check(*actions)


def test_a_version_keeping_the_rules_passes():
    _check(_remove(BUCKET, OLD), _add(BUCKET, 900, 10, NEW), _add(UPDATE, 700, 2))
    _check(_remove(BUCKET, OLD), _add("chk-2/job/step/attempt-1/part-b00000.parquet", 800, 7))  # a compaction


def _keys(*rows: tuple[Any, ...]) -> pa.Table:
    return pa.table(
        {"a": pa.array([r[0] for r in rows], pa.string()), "b": pa.array([r[1] for r in rows], pa.string())}
    )


def test_one_live_row_per_key():
    keys = ["a", "b"]
    added = _keys((None, ""), ("x", None), ("", ""))
    delta_checks.check_keys("c", keys, added, _keys((None, ""), ("", "")))
    delta_checks.check_keys("c", keys, added, _keys())
    with pytest.raises(DocumentError, match=r"the rows the checkpoint adds hold 1 key\(s\) more than once"):
        delta_checks.check_keys("c", keys, _keys((None, ""), (None, "")), _keys())
    with pytest.raises(DocumentError, match=r"the table holds live rows of 1 key\(s\) more than once.*None, ''"):
        delta_checks.check_keys("c", keys, added, _keys((None, ""), ("x", None), (None, "")))
    with pytest.raises(DocumentError, match=r"keys the checkpoint does not add, e.g. \(None, None\)"):
        delta_checks.check_keys("c", keys, added, _keys((None, None)))
    delta_checks.check_rewrite("c", BUCKET, 10, 6, 4)
    with pytest.raises(DocumentError, match="holds 5 rows, not its 4 live ones"):
        delta_checks.check_rewrite("c", BUCKET, 10, 6, 5)


_INT_KEYS = st.lists(st.one_of(st.integers(-4, 8), st.none()), max_size=10)


@settings(max_examples=300)
@given(_INT_KEYS, _INT_KEYS)
def test_keys_checked_from_the_writers_key_set_as_from_the_table(added: list[Any], deleted: list[Any]) -> None:
    """The upsert hands ``check_keys`` its :class:`KeySet` (the sort reused) or the keys as a table: the
    same verdict either way, the one a plain Python model gives (each added key once, each deleted key at
    most once and among the added ones; a null a key value)."""
    table, gone = pa.table({"k": pa.array(added, pa.int64())}), pa.table({"k": pa.array(deleted, pa.int64())})
    ok = len(set(added)) == len(added) and len(set(deleted)) == len(deleted) and set(deleted) <= set(added)
    for given_as in (table, KeySet(table, ["k"])):
        try:
            delta_checks.check_keys("c", ["k"], given_as, gone)
            refused = False
        except DocumentError:
            refused = True
        assert refused == (not ok), (type(given_as).__name__, added, deleted)
