"""Many pgoutput messages at once: the messages in one buffer (:class:`Messages`), and the TupleData of many
change messages of one tuple parsed together with numpy into Arrow string arrays (:func:`tuple_columns`):
positions advance column by column across all the messages at once; no Python per message or value. A
column's texts are cut out of the buffer by Arrow (``take`` of every other value of the buffer read as
strings whose bounds alternate between a text and the bytes up to the next one), not gathered byte by byte."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from airflow_provider_checkpoint.fileio.arrow_numpy import arrow_of, strings_of

if TYPE_CHECKING:
    import pyarrow as pa

PAD = 8
"""Zero bytes after the last message: a read of a few bytes just past a message's end stays in the buffer."""
_I, _U, _D, _N, _K = b"IUDNK"


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
    def words(self) -> np.ndarray:
        """The big-endian unsigned 32-bit int at each byte of ``data`` (``words[i]``: bytes ``i`` to ``i + 3``): a
        view, no copy."""
        return np.ndarray((len(self.data) - 3,), ">u4", self.data, strides=(1,))

    @cached_property
    def strings(self) -> pa.Buffer:
        """``data`` as an Arrow buffer (no copy)."""
        import pyarrow as pa

        return pa.py_buffer(self.data)

    def message(self, i: int) -> bytes:
        return self.data[int(self.starts[i]) : int(self.ends[i])]

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
    def oids(self) -> np.ndarray:
        """Each message's bytes 1 to 4 as a big-endian unsigned int (a change's relation oid)."""
        return self.words[self.starts + 1].astype(np.int64)

    @cached_property
    def run_stops(self) -> np.ndarray:
        """For each message, the index after the last of its run: the changes of one tuple of one relation
        that follow one another (the message alone if it is no such change)."""
        simple, oids = self.simple, self.oids
        if not len(simple):
            return np.zeros(0, np.int64)
        new = np.ones(len(simple), bool)
        new[1:] = ~(simple[1:] & simple[:-1] & (oids[1:] == oids[:-1]))
        firsts = np.flatnonzero(new)
        stops = np.append(firsts[1:], len(simple))
        return np.repeat(stops, stops - firsts)


def tuple_columns(messages: Messages, index: np.ndarray, width: int) -> list[pa.Array] | None:
    """The values of change messages ``index`` (ascending) of one tuple each (kind, relation oid, marker,
    TupleData), all of ``width`` values, as one string array per column; ``None`` if any is not made of text
    and null values only (valid UTF-8), or does not end where its tuple does (decode it alone: its error or its
    unchanged values), or ``index`` is not ascending."""
    import pyarrow as pa

    buf, words, starts, ends = messages.array, messages.words, messages.starts[index], messages.ends[index]
    if len(index) and (np.any(ends - starts < 8) or np.any(np.diff(index) <= 0)):
        return None
    at = starts + 6
    if np.any((buf[at].astype(np.int64) << 8 | buf[at + 1]) != width):
        return None
    at += 2
    whole = messages.strings
    every_other = pa.py_buffer(np.arange(0, 2 * len(index), 2, dtype=np.int64))
    out: list[pa.Array] = []
    for _ in range(width):
        if np.any(at >= ends):
            return None
        kind = buf[at]
        text = kind == 0x74
        if not np.all(text | (kind == 0x6E)):
            return None
        length = np.where(text, words[at + 1], 0).astype(np.int64)
        start = np.where(text, at + 5, at)  # a null: no bytes, where it is
        stop = start + length
        if np.any(length >= 1 << 31) or np.any(np.where(text, stop, at + 1) > ends):
            return None  # a negative length, a value past its message's end
        bounds = np.empty(2 * len(index) + 1, np.int64)  # text, bytes up to the next text, text, ...
        bounds[0:-1:2], bounds[1::2] = start, stop
        bounds[-1] = stop[-1] if len(stop) else 0
        cut = pa.Array.from_buffers(pa.large_string(), 2 * len(index), [None, pa.py_buffer(bounds), whole])
        texts = cut.take(pa.Array.from_buffers(pa.int64(), len(index), [None, every_other]))
        valid = pa.py_buffer(np.packbits(text, bitorder="little"))
        array = pa.Array.from_buffers(pa.large_string(), len(index), [valid, *texts.buffers()[1:]])
        try:
            array.validate(full=True)  # UTF-8
        except pa.ArrowInvalid:
            return None
        out.append(array)
        at = np.where(text, stop, at + 1)
    return out if np.all(at == ends) else None


def decoded_codes(codes: np.ndarray, names: list[str]) -> pa.Array:
    """``names[code]`` of each code, as a string array."""
    import pyarrow as pa

    return pa.DictionaryArray.from_arrays(arrow_of(codes.astype(np.int32)), strings_of(names)).dictionary_decode()


def positions(starts: list[int], stops: list[int]) -> np.ndarray:
    """Every position of the ranges ``[starts[i], stops[i])``, in order."""
    first, lengths = np.array(starts, np.int64), np.array(stops, np.int64) - np.array(starts, np.int64)
    offsets = np.cumsum(lengths) - lengths
    return np.repeat(first - offsets, lengths) + np.arange(int(lengths.sum()))
