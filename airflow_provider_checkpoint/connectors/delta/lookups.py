"""Where a Delta upsert's changed keys have live rows: per earlier file, the positions of its live rows whose key
changed (the rows the checkpoint's new DV deletes), read from the files' key columns with pyarrow, a few files at
a time and batch by batch, or from the key columns a preparation read ahead (:mod:`.prepared`), looked up in one
go. A row its DV deletes already is no hit."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from airflow_provider_checkpoint.connectors.base.bucket_merge import BATCH_ROWS, KeySet
from airflow_provider_checkpoint.connectors.base.file_threads import each_file
from airflow_provider_checkpoint.connectors.delta import deletion_vectors
from airflow_provider_checkpoint.connectors.delta.log import DataFile
from airflow_provider_checkpoint.fileio.arrow_numpy import arrow_of
from airflow_provider_checkpoint.storage.object_store import open_sized

if TYPE_CHECKING:
    import fsspec
    import pyarrow as pa
    import pyarrow.parquet as pq


@dataclass(frozen=True, eq=False)
class Found:
    """A file holding live rows whose key changed."""

    file: DataFile
    rows: int
    deleted: np.ndarray
    """Every deleted position of the file after this checkpoint (sorted, unique)."""
    old: np.ndarray
    """Those its DV in the table deletes."""
    keys: pa.Table
    """The keys of the live rows this checkpoint deletes from the file."""


@dataclass(frozen=True)
class ReadAhead:
    """What was read of live files before the stage (:mod:`.prepared`), by path: their key columns, batch by batch as
    :meth:`Lookup._file` reads them (:func:`read_keys`), and the positions their DVs delete."""

    keys: dict[str, list[pa.Table]] = field(default_factory=dict)
    deleted: dict[str, np.ndarray] = field(default_factory=dict)


def read_keys(fs: fsspec.AbstractFileSystem, root: str, file: DataFile, names: list[str]) -> list[pa.Table]:
    """The columns ``names`` of ``file``, batch by batch as :meth:`Lookup._file` reads them."""
    with open_sized(fs, f"{root}/{file.path}", file.size) as source:
        return list(_key_batches(source, names))


def _key_batches(source: object, names: list[str]) -> Iterator[pa.Table]:
    import pyarrow as pa

    for batch in pq_file(source).iter_batches(batch_size=BATCH_ROWS, columns=names):
        yield pa.Table.from_batches([batch])


@dataclass(frozen=True)
class Lookup:
    """The changed keys ``changed`` (of the types ``key_types``) looked up in files of the table at ``root`` on
    ``fs``."""

    fs: fsspec.AbstractFileSystem
    root: str
    changed: KeySet
    key_types: pa.Schema

    def files(self, candidates: list[DataFile], read: ReadAhead) -> list[Found]:
        """Every candidate file holding live rows whose key changed, in their order. The files whose key columns
        ``read`` holds are looked up together (:meth:`_read_ahead`), the others one by one (:meth:`_file`)."""
        ahead = [c for c in candidates if c.path in read.keys]
        found = {f.file.path: f for f in self._read_ahead(ahead, read)}
        others = [c for c in candidates if c.path not in read.keys]
        found |= {f.file.path: f for f in each_file(self._file, others) if f}
        return [found[c.path] for c in candidates if c.path in found]

    def _read_ahead(self, files: list[DataFile], read: ReadAhead) -> list[Found]:
        """:meth:`_file` of ``files``, whose key columns ``read`` holds: their keys looked up in one go (one
        :meth:`KeySet.changed` of them all, not one per file and batch), then each file with a hit against its
        DV (as ``read`` holds it, else read now)."""
        import pyarrow as pa

        types = self.key_types
        tables = [
            pa.concat_tables([b.select(types.names).cast(types) for b in read.keys[f.path]])
            if read.keys[f.path]
            else types.empty_table()
            for f in files
        ]
        bounds = np.cumsum([0, *(t.num_rows for t in tables)], dtype=np.int64)
        at = np.flatnonzero(self.changed.changed(pa.concat_tables(tables))) if tables else np.zeros(0, np.int64)
        cuts = np.searchsorted(at, bounds)  # file i's hits: at[cuts[i]:cuts[i + 1]]

        def found(i: int) -> Found | None:
            hits = (at[cuts[i] : cuts[i + 1]] - bounds[i]).astype(np.uint64)
            old = read.deleted.get(files[i].path)
            old = deleted_positions(self.fs, self.root, files[i]) if old is None else old
            new = hits[~among(hits, old)]
            return _found(
                files[i], tables[i].num_rows, old, new, lambda: tables[i].take(arrow_of(new.astype(np.int64)))
            )

        return [f for f in each_file(found, [i for i in range(len(files)) if cuts[i + 1] > cuts[i]]) if f]

    def _file(self, file: DataFile) -> Found | None:
        """The positions of ``file``'s *live* rows whose key changed, with those its DV deleted already;
        ``None`` if no live row of the file changed (its DV stays as it is). Read batch by batch.

        A key changed before has a row in this file that the file's DV deletes already (the key's live row
        is in a later file): that row is no hit. Counting it made a file whose only hits were deleted rows
        get a "new" DV equal to its old one, committed as a ``remove`` and an ``add`` of the same path and
        DV, which the Delta protocol forbids and readers resolve by dropping the whole file (issue #30)."""
        import pyarrow as pa

        old = deleted_positions(self.fs, self.root, file)
        hits, deleted_keys, rows = [], [], 0
        with open_sized(self.fs, f"{self.root}/{file.path}", file.size) as source:
            for batch in _key_batches(source, self.key_types.names):
                keys = batch.select(self.key_types.names).cast(self.key_types)
                at = np.flatnonzero(self.changed.changed(keys))
                live = ~among(at.astype(np.uint64) + np.uint64(rows), old)
                hits.append(at[live].astype(np.uint64) + np.uint64(rows))
                deleted_keys.append(keys.take(arrow_of(at[live])))
                rows += batch.num_rows
        new = np.concatenate(hits) if hits else np.zeros(0, dtype=np.uint64)
        return _found(file, rows, old, new, lambda: pa.concat_tables(deleted_keys))


def _found(file: DataFile, rows: int, old: np.ndarray, new: np.ndarray, keys: Callable[[], pa.Table]) -> Found | None:
    """``file`` of ``rows`` rows, whose DV deletes ``old``, with live rows ``new`` (sorted) whose key changed (their
    keys: ``keys()``); ``None`` without such rows."""
    if not len(new):
        return None
    if len(old) and int(old[-1]) >= rows:  # a DV past the file's rows: kept for the commit's checks to refuse
        return Found(file, rows, np.sort(np.concatenate([old, new])), old, keys())
    deleted = np.zeros(rows, dtype=bool)  # both sorted, none in both (the hits are live rows): their union sorted
    deleted[old] = True
    deleted[new] = True
    return Found(file, rows, np.flatnonzero(deleted).astype(np.uint64), old, keys())


def among(values: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Per value of ``values``: whether the sorted ``positions`` (uint64, as a DV gives them) hold it."""
    if not len(positions):
        return np.zeros(len(values), dtype=bool)
    at = np.minimum(np.searchsorted(positions, values), len(positions) - 1)
    return np.asarray(positions[at] == values, dtype=bool)


def deleted_positions(fs: fsspec.AbstractFileSystem, root: str, file: DataFile) -> np.ndarray:
    """The positions ``file``'s DV in the table deletes (none without a DV)."""
    if file.deletion_vector is None:
        return np.zeros(0, dtype=np.uint64)
    return deletion_vectors.read_positions(fs, root, file.deletion_vector, f"deletion vector of {file.path}")


def pq_file(source: object) -> pq.ParquetFile:
    import pyarrow.parquet as pq

    return pq.ParquetFile(source, coerce_int96_timestamp_unit="us")
