"""A bounded thread map for work on a table's files (reads, writes, footers, lookups): an object store's round
trips overlap, and pyarrow's Parquet reads and numpy's array work, which release the GIL, run beside each other."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

FILE_THREADS = 8
"""Files worked on at once."""

_T = TypeVar("_T")
_R = TypeVar("_R")


def each_file(work: Callable[[_T], _R], items: Sequence[_T], threads: int = FILE_THREADS) -> list[_R]:
    """``work`` of every item, at most ``threads`` at once, results in the items' order; the first error raised
    (the others still finish). One item or ``threads=1``: run on the calling thread."""
    if len(items) <= 1 or threads <= 1:
        return [work(i) for i in items]
    with ThreadPoolExecutor(min(threads, len(items)), thread_name_prefix="file") as pool:
        return list(pool.map(work, items))
