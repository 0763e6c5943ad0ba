"""Delta deletion vectors: the rows of a data file a commit marks deleted (pure Python and numpy).

A deletion vector (DV) lets a Delta commit delete rows without rewriting their file: the
``add`` action of the file carries a descriptor of a bitmap of the deleted row positions
(0-based, in file order). Layout, as the Delta protocol ("Deletion Vector Format") gives it:

- the bitmap is a *RoaringBitmapArray*: magic ``1681511377`` (int32 LE), the number of
  32-bit bitmaps (int64 LE), then per bitmap its key (high 32 bits, int32 LE) and the
  bitmap in Roaring's portable serialization;
- a DV file holds a version byte ``1``, then per DV: its size (int32 BE), the bitmap, the
  CRC-32 of the bitmap (int32 BE); a descriptor points at the size field (``offset``);
- descriptor ``storageType`` ``'u'``: ``pathOrInlineDv`` is ``<prefix><Z85 of a UUID>``
  and the file is ``<table>/<prefix>/deletion_vector_<uuid>.bin``; ``'i'``: the Z85 of the
  bitmap itself; ``'p'`` (an absolute path) is refused: it may point outside the table.

Every descriptor and DV file is untrusted: shapes, sizes, checksums and cardinalities are
checked before a position is used.

Why ours: delta-rs 1.x cannot write deletion vectors (its ``AddAction``/``RemoveAction`` have no
``deletionVector``; its ``DELETE``/``MERGE`` rewrite files) and reads them only for the whole table at once
(``DeltaTable.deletion_vectors()``: a list of booleans per row of every file with one), where an upsert
reads the DVs of the files it touches; no Python binding of delta-kernel writes either.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from airflow_provider_checkpoint.core.documents import Fields, path_problem
from airflow_provider_checkpoint.exceptions import DocumentError

if TYPE_CHECKING:
    import fsspec

MAGIC = 1681511377
_NO_RUNS, _RUNS = 12346, 12347  # Roaring portable cookies
_ARRAY_MAX = 4096
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_TABLE = np.full(256, -1, dtype=np.int64)
_Z85_TABLE[np.frombuffer(_Z85.encode(), dtype=np.uint8)] = np.arange(85)
_Z85_POWERS = np.array([85**4, 85**3, 85**2, 85, 1], dtype=np.uint64)
_Z85_BYTES = np.frombuffer(_Z85.encode(), dtype=np.uint8)
_UUID_CHARS = 20
MAX_POSITIONS = 2**31
"""A DV never names more rows than a Parquet file of ours can hold."""


def z85_encode(data: bytes) -> str:
    """Z85 (ZeroMQ base-85) of ``data``, whose length is a multiple of 4."""
    if len(data) % 4:
        raise ValueError("Z85 encodes whole 4-byte words")
    words = np.frombuffer(data, dtype=">u4").astype(np.uint64)
    digits = (words[:, None] // _Z85_POWERS[None, :]) % np.uint64(85)  # most significant digit first
    return _Z85_BYTES[digits.ravel()].tobytes().decode("ascii")


def z85_decode(text: str) -> bytes | None:
    """The bytes of Z85 ``text``; ``None`` if it is not Z85."""
    raw = np.frombuffer(text.encode("latin-1", errors="replace"), dtype=np.uint8)
    digits = _Z85_TABLE[raw]
    if len(text) % 5 or (digits < 0).any():
        return None
    words = digits.reshape(-1, 5).astype(np.uint64) @ _Z85_POWERS
    if (words >= 2**32).any():
        return None
    return words.astype(">u4").tobytes()


# -- bitmaps ---------------------------------------------------------------------------------
def serialize(positions: np.ndarray) -> bytes:
    """The RoaringBitmapArray of ``positions`` (unique, sorted, non-negative integers)."""
    values = np.asarray(positions, dtype=np.uint64)
    highs = (values >> np.uint64(32)).astype(np.int64)
    keys, starts = np.unique(highs, return_index=True)
    ends = [*starts[1:].tolist(), len(values)]
    parts = [struct.pack("<iq", MAGIC, len(keys))]
    for key, start, end in zip(keys.tolist(), starts.tolist(), ends, strict=True):
        parts.append(struct.pack("<i", key))
        parts.append(_portable((values[start:end] & np.uint64(0xFFFFFFFF)).astype(np.uint32)))
    return b"".join(parts)


def _portable(values: np.ndarray) -> bytes:
    """One 32-bit Roaring bitmap in the portable format, without run containers."""
    highs = (values >> np.uint32(16)).astype(np.uint16)
    keys, starts, counts = np.unique(highs, return_index=True, return_counts=True)
    bodies = []
    for start, count in zip(starts.tolist(), counts.tolist(), strict=True):
        lows = (values[start : start + count] & np.uint32(0xFFFF)).astype("<u2")
        if count <= _ARRAY_MAX:
            bodies.append(lows.tobytes())
        else:
            bits = np.zeros(65536, dtype=bool)
            bits[lows] = True
            bodies.append(np.packbits(bits, bitorder="little").tobytes())
    header = struct.pack("<II", _NO_RUNS, len(keys))
    header += b"".join(struct.pack("<HH", k, c - 1) for k, c in zip(keys.tolist(), counts.tolist(), strict=True))
    offset = len(header) + 4 * len(keys)
    offsets = []
    for body in bodies:
        offsets.append(struct.pack("<I", offset))
        offset += len(body)
    return header + b"".join(offsets) + b"".join(bodies)


def deserialize(data: bytes, where: str) -> np.ndarray:
    """The sorted positions (uint64) of a RoaringBitmapArray; a :class:`DocumentError` if malformed."""
    reader = _Reader(data, where)
    if reader.unpack("<i")[0] != MAGIC:
        raise DocumentError(where, "deletion vector", f"does not start with the magic number {MAGIC}")
    (count,) = reader.unpack("<q")
    if not 0 <= count <= len(data):
        raise DocumentError(where, "deletion vector", "has an impossible number of bitmaps", count)
    parts = []
    for _ in range(count):
        (high,) = reader.unpack("<i")
        if high < 0:
            raise DocumentError(where, "deletion vector", "has a negative bitmap key", high)
        parts.append(reader.bitmap().astype(np.uint64) | (np.uint64(high) << np.uint64(32)))
    if reader.at != len(data):
        raise DocumentError(where, "deletion vector", "has bytes after its last bitmap")
    positions = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)
    if len(positions) > 1 and not bool(np.all(positions[1:] > positions[:-1])):
        raise DocumentError(where, "deletion vector", "is not a sorted set of positions")
    return positions


class _Reader:
    def __init__(self, data: bytes, where: str) -> None:
        self.data, self.at, self.where = data, 0, where

    def take(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.data):
            raise DocumentError(self.where, "deletion vector", "is truncated")
        self.at += n
        return self.data[self.at - n : self.at]

    def unpack(self, fmt: str) -> tuple[int, ...]:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))

    def bitmap(self) -> np.ndarray:
        """One portable 32-bit Roaring bitmap (array, bitmap and run containers)."""
        (cookie,) = self.unpack("<I")
        runs = b""
        if cookie & 0xFFFF == _RUNS:
            count = (cookie >> 16) + 1
            runs = self.take((count + 7) // 8)
        elif cookie == _NO_RUNS:
            (count,) = self.unpack("<I")
        else:
            raise DocumentError(self.where, "deletion vector", "holds a bitmap with an unknown cookie", cookie)
        if count > 65536:
            raise DocumentError(self.where, "deletion vector", "has too many containers", count)
        headers = [self.unpack("<HH") for _ in range(count)]
        if cookie == _NO_RUNS or count >= 4:  # the offset header; the bodies follow in order anyway
            self.take(4 * count)
        values = []
        for i, (key, card) in enumerate(headers):
            base = np.uint32(key) << np.uint32(16)
            if runs and runs[i // 8] >> (i % 8) & 1:
                (n,) = self.unpack("<H")
                pairs = np.frombuffer(self.take(4 * n), dtype="<u2").reshape(-1, 2).astype(np.uint32)
                low = np.concatenate(
                    [np.arange(s, s + length + 1, dtype=np.uint32) for s, length in pairs] or [np.zeros(0, np.uint32)]
                )
            elif card + 1 > _ARRAY_MAX:
                bits = np.unpackbits(np.frombuffer(self.take(8192), dtype=np.uint8), bitorder="little")
                low = np.flatnonzero(bits.view(np.bool_)).astype(np.uint32)  # of bools: 10x faster than of bytes
            else:
                low = np.frombuffer(self.take(2 * (card + 1)), dtype="<u2").astype(np.uint32)
            values.append(base | low)
        return np.concatenate(values) if values else np.zeros(0, dtype=np.uint32)


# -- descriptors and files ---------------------------------------------------------------------
@dataclass(frozen=True)
class Descriptor:
    """A ``deletionVector`` descriptor of an ``add`` or ``remove`` action."""

    storage_type: str
    path_or_inline: str
    offset: int | None
    size: int
    cardinality: int

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"storageType": self.storage_type, "pathOrInlineDv": self.path_or_inline}
        if self.offset is not None:
            out["offset"] = self.offset
        return {**out, "sizeInBytes": self.size, "cardinality": self.cardinality}

    def file(self) -> str | None:
        """The DV file's path relative to the table (``'u'``), ``None`` for an inline DV."""
        if self.storage_type != "u":
            return None
        prefix, encoded = self.path_or_inline[:-_UUID_CHARS], self.path_or_inline[-_UUID_CHARS:]
        name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(encoded))}.bin"
        return f"{prefix}/{name}" if prefix else name


def read_descriptor(f: Fields) -> Descriptor:
    """A descriptor validated: storage type ``'u'`` (a safe path inside the table) or ``'i'``."""
    kind = f.string("storageType", max_length=1)
    text = f.text("pathOrInlineDv")
    size, cardinality = f.integer("sizeInBytes", 1), f.integer("cardinality", 1, MAX_POSITIONS)
    if kind == "u":
        prefix, encoded = text[:-_UUID_CHARS], text[-_UUID_CHARS:]
        decoded = z85_decode(encoded)
        problem = path_problem(prefix, strict=False) if prefix else None
        if len(text) < _UUID_CHARS or decoded is None or len(decoded) != 16 or problem:
            raise f.error("pathOrInlineDv", "must be a safe relative prefix and the Z85 of a UUID", text)
        return Descriptor(kind, text, f.integer("offset"), size, cardinality)
    if kind == "i":
        if z85_decode(text) is None:
            raise f.error("pathOrInlineDv", "must be Z85 text", text)
        return Descriptor(kind, text, None, size, cardinality)
    raise f.error("storageType", "must be 'u' (a file in the table) or 'i' (inline)", kind)


def new_descriptor_path(prefix: str) -> tuple[str, str]:
    """``(pathOrInlineDv, table-relative file path)`` of a new DV file in directory ``prefix``."""
    new = uuid.uuid4()
    return prefix + z85_encode(new.bytes), f"{prefix}/deletion_vector_{new}.bin"


def inline(positions: np.ndarray) -> Descriptor:
    """An inline (``'i'``) descriptor of ``positions``: the bitmap Z85-encoded in the log itself, padded
    to whole 4-byte words (``sizeInBytes`` is the unpadded size)."""
    data = serialize(positions)
    return Descriptor("i", z85_encode(data + b"\0" * (-len(data) % 4)), None, len(data), len(positions))


def write_file(
    fs: fsspec.AbstractFileSystem, path: str, prefix_and_name: str, bitmaps: Sequence[np.ndarray]
) -> list[Descriptor]:
    """Write the DVs of ``bitmaps`` (positions each) into one DV file at ``path``; their descriptors."""
    parts, descriptors, offset = [b"\x01"], [], 1
    for positions in bitmaps:
        data = serialize(positions)
        parts += [struct.pack(">i", len(data)), data, struct.pack(">I", zlib.crc32(data))]
        descriptors.append(Descriptor("u", prefix_and_name, offset, len(data), len(positions)))
        offset += len(data) + 8
    with fs.open(path, "wb") as out:
        out.write(b"".join(parts))
    return descriptors


def read_positions(
    fs: fsspec.AbstractFileSystem, root: str, dv: Descriptor, where: str, files: dict[str, bytes] | None = None
) -> np.ndarray:
    """The deleted positions a descriptor names, checked against its size, checksum and cardinality.

    Given ``files`` (DV file path → its bytes), a DV file is read whole once and kept there, for
    callers decoding many DVs of few files (one read per file instead of one per DV)."""
    path = dv.file()
    if path is None:
        data = z85_decode(dv.path_or_inline) or b""
        if len(data) < dv.size:
            raise DocumentError(where, "deletionVector", "is shorter than its sizeInBytes", dv.size)
        data = data[: dv.size]
    else:
        assert dv.offset is not None
        try:
            if files is None:
                with fs.open(f"{root}/{path}", "rb") as f:
                    f.seek(dv.offset)
                    head = f.read(4 + dv.size + 4)
            else:
                if path not in files:
                    files[path] = fs.cat_file(f"{root}/{path}")
                head = files[path][dv.offset : dv.offset + 4 + dv.size + 4]
        except FileNotFoundError:
            raise DocumentError(where, "deletionVector", "names a DV file that does not exist", path) from None
        if len(head) != dv.size + 8 or struct.unpack(">i", head[:4])[0] != dv.size:
            raise DocumentError(where, "deletionVector", f"does not match the size stored in {path}", dv.size)
        data = head[4:-4]
        if struct.unpack(">I", head[-4:])[0] != zlib.crc32(data):
            raise DocumentError(where, "deletionVector", f"fails its checksum in {path}")
    positions = deserialize(data, where)
    if len(positions) != dv.cardinality:
        raise DocumentError(
            where, "deletionVector", f"names {len(positions)} rows, not its cardinality", dv.cardinality
        )
    return positions
