"""Spark's ``xxhash64`` of key columns computed on the driver with numpy, and the key-group range it gives.

:func:`~airflow_provider_checkpoint.state.spark_backend.key_group` files a state row under
``pmod(xxhash64(keys), max_parallelism)``; a merge on the driver that makes keys of its own (a session
whose bounds grew) files them with :func:`range_indexes`, which gives the same range for every row
(the state stays readable by either path). Spark's ``XxHash64`` expression (seed 42) hashes each
non-null column with the previous column's hash as its seed (a null column leaves it as it was): an
integer, a short, a byte, a boolean (1 or 0) or a date with ``hashInt`` (4 bytes), a long or a
timestamp with ``hashLong`` (8 bytes), a string with ``hashUnsafeBytes`` of its UTF-8 bytes: the XXH64
algorithm over those little-endian bytes. Other types are not hashed here (:func:`hashable`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

SEED = 42
"""The seed of Spark's ``xxhash64`` function."""
_P1, _P2, _P3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
_P4, _P5 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5
_INTS = ("int8", "int16", "int32", "bool", "date32[day]")


def hashable(table: pa.Table | pa.Schema, columns: Sequence[str]) -> bool:
    """Whether :func:`xxhash64` hashes every one of ``columns`` (of ``table``'s types) as Spark does."""
    import pyarrow as pa

    schema = table if isinstance(table, pa.Schema) else table.schema
    return all(_kind(schema.field(c).type) is not None for c in columns)


def range_indexes(table: pa.Table, keys: Sequence[str], max_parallelism: int, parallelism: int) -> pa.Array:
    """Per row of ``table``, the index of the key-group range (of ``parallelism``) of its ``keys``, as
    :func:`~airflow_provider_checkpoint.state.spark_backend.range_index` gives it in Spark (int32)."""
    import numpy as np

    from airflow_provider_checkpoint.fileio.arrow_numpy import arrow_of

    return arrow_of(ranges_of(xxhash64(table, keys).view(np.int64), max_parallelism, parallelism))


def ranges_of(hashes: np.ndarray, max_parallelism: int, parallelism: int) -> np.ndarray:
    """The index of the key-group range (of ``parallelism``) of each of Spark's ``xxhash64`` ``hashes`` (int64),
    as :func:`~airflow_provider_checkpoint.state.spark_backend.range_index` gives it (int32)."""
    import numpy as np

    groups = hashes % max_parallelism  # Spark's pmod: never negative
    return (groups * parallelism // max_parallelism).astype(np.int32)


def xxhash64(table: pa.Table, keys: Sequence[str]) -> np.ndarray:
    """Spark's ``xxhash64(*keys)`` of every row of ``table``, as uint64 (its bits; Spark shows them signed)."""
    import numpy as np

    from airflow_provider_checkpoint.fileio.arrow_numpy import numpy_of

    hashes = np.full(len(table), SEED, np.uint64)
    with np.errstate(over="ignore"):
        for key in keys:
            column = table[key].combine_chunks()
            kind = _kind(column.type)
            if kind is None:
                raise TypeError(f"column {key!r} of type {column.type} is not hashed on the driver")
            valid = numpy_of(column.is_valid())
            if kind == "bytes":
                new = _hash_strings(column, hashes)
            else:
                values = _numbers(column, kind)
                new = _hash_int(values, hashes) if kind == "int" else _hash_long(values, hashes)
            hashes = np.where(valid, new, hashes)
    return hashes


def _kind(type_: pa.DataType) -> str | None:
    import pyarrow as pa

    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        return "bytes"
    if str(type_) in _INTS:
        return "int"
    if pa.types.is_int64(type_) or pa.types.is_timestamp(type_):
        return "long" if not pa.types.is_timestamp(type_) or type_.unit == "us" else None
    return None


def _numbers(column: pa.Array, kind: str) -> np.ndarray:
    """The column's values as Spark hashes them (nulls as zero): int32 or int64 bits in uint64."""
    import numpy as np
    import pyarrow as pa

    from airflow_provider_checkpoint.fileio.arrow_numpy import numpy_of

    if pa.types.is_boolean(column.type):
        column = column.cast(pa.int32())
    elif pa.types.is_date32(column.type) or pa.types.is_timestamp(column.type):
        column = column.view(pa.int32() if kind == "int" else pa.int64())
    values = numpy_of(column.fill_null(0) if column.null_count else column)  # pa.scalar(0) imports pandas
    if kind == "int":
        return values.astype(np.int32).view(np.uint32).astype(np.uint64)  # a byte or short: sign-extended first
    return values.astype(np.int64).view(np.uint64)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    import numpy as np

    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _fmix(h: np.ndarray) -> np.ndarray:
    import numpy as np

    h = h ^ (h >> np.uint64(33))
    h = h * np.uint64(_P2)
    h = h ^ (h >> np.uint64(29))
    h = h * np.uint64(_P3)
    return h ^ (h >> np.uint64(32))


def _hash_int(values: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    import numpy as np

    h = seeds + np.uint64(_P5 + 4)
    h = h ^ (values * np.uint64(_P1))
    return _fmix(_rotl(h, 23) * np.uint64(_P2) + np.uint64(_P3))


def _hash_long(values: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    import numpy as np

    h = seeds + np.uint64(_P5 + 8)
    h = h ^ (_rotl(values * np.uint64(_P2), 31) * np.uint64(_P1))
    return _fmix(_rotl(h, 27) * np.uint64(_P1) + np.uint64(_P4))


def _round(acc: np.ndarray, lane: np.ndarray) -> np.ndarray:
    import numpy as np

    return _rotl(acc + lane * np.uint64(_P2), 31) * np.uint64(_P1)


def _hash_strings(column: pa.Array, seeds: np.ndarray) -> np.ndarray:
    """XXH64 of each string's UTF-8 bytes with its row's seed, rows of one length at a time."""
    import numpy as np
    import pyarrow as pa

    if pa.types.is_large_string(column.type):
        column = column.cast(pa.string())
    offsets = np.frombuffer(column.buffers()[1], np.int32)[column.offset : column.offset + len(column) + 1]
    data = column.buffers()[2]
    data = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    starts, lengths = offsets[:-1].astype(np.int64), np.diff(offsets).astype(np.int64)
    out = np.empty(len(column), np.uint64)
    for length in np.unique(lengths):
        rows = np.flatnonzero(lengths == length)
        n = int(length)
        raw = data[starts[rows, None] + np.arange(n)] if n else np.zeros((len(rows), 0), np.uint8)
        out[rows] = _xxh64_rows(np.ascontiguousarray(raw), seeds[rows], n)
    return out


def _xxh64_rows(raw: np.ndarray, seeds: np.ndarray, n: int) -> np.ndarray:
    """XXH64 of each row of ``raw`` (rows of ``n`` bytes), each with its own seed."""
    import numpy as np

    def words(at: int, size: int) -> np.ndarray:
        chunk = np.ascontiguousarray(raw[:, at : at + size])
        return chunk.view(np.uint64 if size == 8 else np.uint32).reshape(len(raw)).astype(np.uint64)

    at = 0
    if n >= 32:
        v1, v2 = seeds + np.uint64(_P1) + np.uint64(_P2), seeds + np.uint64(_P2)
        v3, v4 = seeds.copy(), seeds - np.uint64(_P1)
        while at + 32 <= n:
            v1, v2 = _round(v1, words(at, 8)), _round(v2, words(at + 8, 8))
            v3, v4 = _round(v3, words(at + 16, 8)), _round(v4, words(at + 24, 8))
            at += 32
        h = _rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)
        for v in (v1, v2, v3, v4):
            h = (h ^ _round(np.zeros_like(v), v)) * np.uint64(_P1) + np.uint64(_P4)
    else:
        h = seeds + np.uint64(_P5)
    h = h + np.uint64(n)
    while at + 8 <= n:
        h = _rotl(h ^ _round(np.zeros_like(h), words(at, 8)), 27) * np.uint64(_P1) + np.uint64(_P4)
        at += 8
    if at + 4 <= n:
        h = _rotl(h ^ (words(at, 4) * np.uint64(_P1)), 23) * np.uint64(_P2) + np.uint64(_P3)
        at += 4
    while at < n:
        h = _rotl(h ^ (raw[:, at].astype(np.uint64) * np.uint64(_P5)), 11) * np.uint64(_P1)
        at += 1
    return _fmix(h)
