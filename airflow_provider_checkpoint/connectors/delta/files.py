"""The Delta sink's committables and input checks, pure Python (no Spark, no delta-rs).

Committables of checkpoint ``N`` (one item per staging attempt that reached the ack)::

    {"checkpoint_id": N,
     "adds": [{"path": "chk-N/<job>/<step>/attempt-<n>/…/part-….parquet", "size": bytes,
               "num_records": rows, "partition_values": {column: text | null}, "bucket": b?}],
     "removes": [{"path": "chk-M/…/part-….parquet", "size": bytes, "deletion_vector": dv?}],   # upsert
     "deletes": [{"path": "chk-M/…/part-….parquet", "size": bytes, "num_records": rows,
                  "old": dv | null, "new": dv}]}                                               # upsert

An upsert table holds bucket files ``part-b<bucket>.parquet`` and update files
``part-u<checkpoint>-<n>.parquet`` (the changed rows of one checkpoint); a ``delete`` gives
an earlier file a new deletion vector (``new``, inline or in a DV file under ``chk-N/``) replacing
``old``. Every path is relative to the table, normalized, and has the shape the writer gives
it: an add lies under ``chk-N/``, a remove or delete names a file of an earlier checkpoint;
no path appears twice and an upsert adds each bucket at most once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_checkpoint.connectors.delta.deletion_vectors import Descriptor, read_descriptor
from airflow_provider_checkpoint.connectors.delta.evolution import read_added
from airflow_provider_checkpoint.connectors.delta.log import DataFile
from airflow_provider_checkpoint.core.documents import Fields, path_problem
from airflow_provider_checkpoint.exceptions import DocumentError

_UPSERT_FILE = re.compile(r"^chk-([1-9]\d{0,18})/(?:[^/]+/)*part-(?:b(\d{5})|u\d{10}-\d{5})\.parquet$")
_APPEND_FILE = re.compile(r"^chk-([1-9]\d{0,18})/(?:[^/]+/)*part-[^/]+\.parquet$")


def bucket_of_path(path: str) -> int | None:
    """The bucket of an upsert table's data file ``path``, ``None`` if it is not one."""
    match = _UPSERT_FILE.fullmatch(path)
    return int(match.group(2)) if match and match.group(2) else None


def is_upsert_file(path: str) -> bool:
    """Whether ``path`` is a bucket or update file of an upsert table."""
    return _UPSERT_FILE.fullmatch(path) is not None


def update_file(checkpoint_id: int, index: int) -> str:
    """The name of the ``index``-th file of the changed rows of ``checkpoint_id``."""
    return f"part-u{checkpoint_id:010d}-{index:05d}.parquet"


@dataclass(frozen=True)
class DeltaFile:
    """One data file of a Delta commit: an add (with records and partition values) or a remove."""

    path: str
    size: int
    num_records: int = 0
    partition_values: dict[str, str | None] = field(default_factory=dict)
    deletion_vector: Descriptor | None = None
    """Of a remove: the DV the removed file has in the table."""

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "size": self.size,
            "num_records": self.num_records,
            "partition_values": self.partition_values,
        }

    def remove_json(self) -> dict[str, Any]:
        dv = self.deletion_vector
        return {"path": self.path, "size": self.size, **({"deletion_vector": dv.to_json()} if dv else {})}


@dataclass(frozen=True)
class DeltaDeletes:
    """Rows of an earlier file a checkpoint deletes: the file's DV ``old`` is replaced by ``new``."""

    path: str
    size: int
    num_records: int
    old: Descriptor | None
    new: Descriptor

    def to_json(self) -> dict[str, Any]:
        old = self.old.to_json() if self.old else None
        return {
            "path": self.path,
            "size": self.size,
            "num_records": self.num_records,
            "old": old,
            "new": self.new.to_json(),
        }


@dataclass(frozen=True)
class DeltaCommit:
    """The validated file actions of one checkpoint."""

    adds: list[DeltaFile]
    removes: list[DeltaFile]
    deletes: list[DeltaDeletes] = field(default_factory=list)
    columns: list[dict[str, Any]] = field(default_factory=list)
    """Input columns the table lacked when staged: the commit adds them (:mod:`.evolution`)."""


def _data_path(f: Fields, key: str, pattern: re.Pattern[str]) -> tuple[str, int]:
    """A table-relative data file path of ``pattern`` (partition directories may hold any printable
    name, as Spark escapes them); with the checkpoint id in its first segment."""
    value = f.raw.get(key)
    if not isinstance(value, str):
        raise f.error(key, "must be a path string", value)
    problem = path_problem(value, strict=False)
    if problem:
        raise f.error(key, f"is not a safe relative path: it {problem}", value)
    match = pattern.fullmatch(value)
    if not match:
        raise f.error(key, f"does not have the expected shape {pattern.pattern}", value)
    return value, int(match.group(1))


def read_delta_committables(
    checkpoint_id: int, committables: Any, upsert: bool, partition_by: list[str], buckets: int, document: str
) -> DeltaCommit:
    """The file actions of ``committables`` if they have exactly the shape the Delta writer stages."""
    reader = Fields({"committables": committables}, document)
    pattern = _UPSERT_FILE if upsert else _APPEND_FILE
    adds: list[DeltaFile] = []
    removes: list[DeltaFile] = []
    deletes: list[DeltaDeletes] = []
    columns: list[dict[str, Any]] = []
    for i, item in enumerate(reader.items("committables")):
        c = Fields(item, document, f"committables[{i}]")
        if c.integer("checkpoint_id", 1) != checkpoint_id:
            raise c.error("checkpoint_id", f"must be {checkpoint_id}", c.raw["checkpoint_id"])
        for j, raw in enumerate(c.items("adds")):
            a = Fields(raw, document, f"{c.where}.adds[{j}]")
            path, owner = _data_path(a, "path", pattern)
            if owner != checkpoint_id:
                raise a.error("path", f"must lie under chk-{checkpoint_id}/", path)
            values = a.obj("partition_values").raw
            if sorted(values) != sorted(partition_by) or not all(
                v is None or isinstance(v, str) for v in values.values()
            ):
                raise a.error("partition_values", f"must map exactly {partition_by} to strings or null", values)
            adds.append(DeltaFile(path, a.integer("size"), a.integer("num_records"), dict(values)))
        for j, raw in enumerate(c.items("removes")):
            r = Fields(raw, document, f"{c.where}.removes[{j}]")
            if not upsert:
                raise r.error("path", "an append commit removes nothing", r.raw.get("path"))
            path, owner = _data_path(r, "path", _UPSERT_FILE)
            if owner >= checkpoint_id:
                raise r.error("path", f"must be a file of a checkpoint before {checkpoint_id}", path)
            dv = read_descriptor(r.obj("deletion_vector")) if r.has("deletion_vector") else None
            removes.append(DeltaFile(path, r.integer("size"), deletion_vector=dv))
        for j, raw in enumerate(c.items("deletes", default=[])):
            deletes.append(_deletes(Fields(raw, document, f"{c.where}.deletes[{j}]"), checkpoint_id, upsert))
        columns += [f for f in read_added(c) if f not in columns]
    paths = [f.path for f in adds + removes + deletes]
    if len(set(paths)) != len(paths):
        raise DocumentError(document, "committables", "name a file twice")
    if upsert:
        added = [b for b in (bucket_of_path(f.path) for f in adds) if b is not None]
        if len(set(added)) != len(added) or any(b >= buckets for b in added):
            raise DocumentError(document, "committables", f"must add each bucket below {buckets} at most once")
    return DeltaCommit(adds, removes, deletes, columns)


def _deletes(d: Fields, checkpoint_id: int, upsert: bool) -> DeltaDeletes:
    """One ``deletes`` item: an earlier file of the table, its DV in the table, its new DV under ``chk-N/``."""
    if not upsert:
        raise d.error("path", "an append commit deletes nothing", d.raw.get("path"))
    path, owner = _data_path(d, "path", _UPSERT_FILE)
    if owner >= checkpoint_id:
        raise d.error("path", f"must be a file of a checkpoint before {checkpoint_id}", path)
    old = read_descriptor(d.obj("old")) if d.has("old") else None
    new = read_descriptor(d.obj("new"))
    dv_file = new.file()
    if dv_file is not None and not dv_file.startswith(f"chk-{checkpoint_id}/"):
        raise d.error("new", f"must be inline or a DV file under chk-{checkpoint_id}/", new.path_or_inline)
    records = d.integer("num_records", 1)
    if new.cardinality > records or (old is not None and old.cardinality > new.cardinality):
        raise d.error("new", f"must delete at most the file's {records} rows and keep the rows deleted before")
    return DeltaDeletes(path, d.integer("size"), records, old, new)


def kept_files(files: dict[str, DataFile]) -> set[str]:
    """The table-relative paths a version references: its data files and their DV files."""
    dvs = {f.deletion_vector.file() for f in files.values() if f.deletion_vector is not None}
    return set(files) | {p for p in dvs if p is not None}


def file_identities(files: dict[str, DataFile]) -> dict[str, Any]:
    """A version's files as Delta tells them apart: path and deletion vector."""
    return {path: f.deletion_vector for path, f in files.items()}


def dv_files(commit: DeltaCommit) -> set[str]:
    """The DV files a commit's new deletion vectors are stored in."""
    return {p for p in (d.new.file() for d in commit.deletes) if p is not None}
