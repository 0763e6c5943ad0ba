"""Many pgoutput messages at once: the messages in one buffer (:class:`Messages`), and the TupleData of many
change messages of one tuple parsed together with numpy into Arrow string arrays (:func:`tuple_columns`):
positions advance column by column across all the messages at once; no Python per message or value."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

PAD = 8
"""Zero bytes after the last message: a read of a few bytes just past a message's end stays in the buffer."""
_I, _U, _D, _N, _K = b"IUDNK"
_LENGTH = np.arange(1, 5)


@dataclass(frozen=True)
class Messages:
    """Messages in one buffer: message ``i`` is ``data[starts[i]:ends[i]]``, in order; ``data`` ends with
    :data:`PAD` zero bytes."""

    data: bytes
    starts: np.ndarray
    ends: np.ndarray

    @classmethod
    def of(cls, messages: Iterable[bytes]) -> Messages:
        chunks = [bytes(m) for m in messages]
        return cls.framed(b"".join(chunks), np.fromiter(map(len, chunks), np.int64, len(chunks)))

    @classmethod
    def framed(cls, data: bytes, sizes: np.ndarray) -> Messages:
        """The messages of sizes ``sizes`` that ``data`` holds one after the other."""
        ends = np.cumsum(sizes, dtype=np.int64)
        if np.any(sizes < 0) or (ends[-1] if len(ends) else 0) != len(data):
            raise ValueError(f"{len(sizes)} message sizes do not add up to the {len(data)} bytes read")
        return cls(data + bytes(PAD), ends - sizes, ends)

    def __len__(self) -> int:
        return len(self.starts)

    @cached_property
    def array(self) -> np.ndarray:
        """``data`` as uint8."""
        return np.frombuffer(self.data, np.uint8)

    @cached_property
    def _bounds(self) -> tuple[list[int], list[int]]:
        return self.starts.tolist(), self.ends.tolist()

    def message(self, i: int) -> bytes:
        starts, ends = self._bounds
        return self.data[starts[i] : ends[i]]

    @cached_property
    def kinds(self) -> np.ndarray:
        """Each message's first byte (0 for an empty message)."""
        return np.where(self.ends > self.starts, self.array[self.starts], 0)

    @cached_property
    def simple(self) -> np.ndarray:
        """Which messages are changes of one tuple: an insert (``N``), an update without an old tuple (``N``:
        the key did not change, no REPLICA IDENTITY FULL), a delete by key (``K``)."""
        kinds, buf = self.kinds, self.array
        marker = np.where(self.ends - self.starts >= 6, buf[self.starts + 5], 0)
        return (((kinds == _I) | (kinds == _U)) & (marker == _N)) | ((kinds == _D) & (marker == _K))

    @cached_property
    def changes(self) -> np.ndarray:
        """Which messages are row changes (insert, update, delete)."""
        kinds = self.kinds
        return (kinds == _I) | (kinds == _U) | (kinds == _D)

    @cached_property
    def simple_list(self) -> list[bool]:
        return self.simple.tolist()  # type: ignore[no-any-return]

    @cached_property
    def oid_list(self) -> list[int]:
        return self.oids.tolist()  # type: ignore[no-any-return]

    @cached_property
    def oids(self) -> np.ndarray:
        """Each message's bytes 1 to 4 as a big-endian unsigned int (a change's relation oid)."""
        return _word(self.array, self.starts)

    @cached_property
    def run_stops(self) -> list[int]:
        """For each message, the index after the last of its run: the changes of one tuple of one relation
        that follow one another (the message alone if it is no such change)."""
        simple, oids = self.simple, self.oids
        if not len(simple):
            return []
        new = np.ones(len(simple), bool)
        new[1:] = ~(simple[1:] & simple[:-1] & (oids[1:] == oids[:-1]))
        firsts = np.flatnonzero(new)
        stops = np.append(firsts[1:], len(simple))
        return np.repeat(stops, stops - firsts).tolist()  # type: ignore[no-any-return]


def _word(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The big-endian unsigned 32-bit ints at ``at + 1`` (``buf`` holds 5 bytes past every ``at``)."""
    return np.ascontiguousarray(buf[at[:, None] + _LENGTH]).view(">u4").ravel().astype(np.int64)


def tuple_columns(messages: Messages, index: np.ndarray, width: int) -> list[pa.Array] | None:
    """The values of change messages ``index`` of one tuple each (kind, relation oid, marker, TupleData),
    all of ``width`` values, as one string array per column; ``None`` if any is not made of text and null
    values only (valid UTF-8), or does not end where its tuple does (decode it alone: its error or its
    unchanged values)."""
    import pyarrow as pa

    buf, starts, ends = messages.array, messages.starts[index], messages.ends[index]
    at = starts + 6
    if np.any(ends - starts < 8) or np.any((buf[at].astype(np.int64) << 8 | buf[at + 1]) != width):
        return None
    at += 2
    out: list[pa.Array] = []
    for _ in range(width):
        if np.any(at >= ends):
            return None
        kind = buf[at]
        text = kind == 0x74
        if not np.all(text | (kind == 0x6E)):
            return None
        length = np.where(text, _word(buf, at), 0)
        start = at + 5
        if np.any(length >= 1 << 31) or np.any(np.where(text, start + length, at + 1) > ends):
            return None  # a negative length, a value past its message's end
        offsets = np.zeros(len(at) + 1, np.int64)
        np.cumsum(length, out=offsets[1:])
        take = np.repeat(start - offsets[:-1], length) + np.arange(offsets[-1])
        valid = pa.py_buffer(np.packbits(text, bitorder="little"))
        data = pa.py_buffer(buf[take].tobytes())
        array = pa.Array.from_buffers(pa.large_string(), len(at), [valid, pa.py_buffer(offsets), data])
        try:
            array.validate(full=True)  # UTF-8
        except pa.ArrowInvalid:
            return None
        out.append(array)
        at = np.where(text, start + length, at + 1)
    return out if np.all(at == ends) else None


def decoded_codes(codes: np.ndarray, names: list[str]) -> pa.Array:
    """``names[code]`` of each code, as a string array."""
    import pyarrow as pa

    return pa.DictionaryArray.from_arrays(
        pa.array(codes.astype(np.int32)), pa.array(names, pa.string())
    ).dictionary_decode()


def positions(starts: list[int], stops: list[int]) -> np.ndarray:
    """Every position of the ranges ``[starts[i], stops[i])``, in order."""
    first, lengths = np.array(starts, np.int64), np.array(stops, np.int64) - np.array(starts, np.int64)
    offsets = np.cumsum(lengths) - lengths
    return np.repeat(first - offsets, lengths) + np.arange(int(lengths.sum()))
