"""Key groups: the unit in which keyed state is stored and rescaled (as in Flink).

A key hashes into one of ``max_parallelism`` key groups, fixed for the life of the
state. Files hold contiguous key-group ranges, so state written with one number of
partitions is read with any other.
"""

from __future__ import annotations

import math


def range_for_index(max_parallelism: int, parallelism: int, index: int) -> tuple[int, int]:
    """The inclusive key-group range of partition ``index`` out of ``parallelism``."""
    _check(max_parallelism, parallelism)
    if not 0 <= index < parallelism:
        raise ValueError(f"index {index} outside [0, {parallelism})")
    start = (index * max_parallelism + parallelism - 1) // parallelism
    end = ((index + 1) * max_parallelism + parallelism - 1) // parallelism - 1
    return start, end


def index_for_key_group(max_parallelism: int, parallelism: int, key_group: int) -> int:
    """The partition that owns ``key_group``; consistent with :func:`range_for_index`."""
    _check(max_parallelism, parallelism)
    if not 0 <= key_group < max_parallelism:
        raise ValueError(f"key group {key_group} outside [0, {max_parallelism})")
    return key_group * parallelism // max_parallelism


def coarsest_nesting(max_parallelism: int, spans: list[tuple[int, int]], at_most: int) -> int:
    """The largest parallelism up to ``at_most`` each of whose ranges holds every one of ``spans``
    (inclusive key-group ranges) it meets whole; 1 always does."""
    for parallelism in range(min(at_most, max_parallelism), 1, -1):
        if all(
            index_for_key_group(max_parallelism, parallelism, lo)
            == index_for_key_group(max_parallelism, parallelism, hi)
            for lo, hi in spans
        ):
            return parallelism
    return 1


def balanced_parallelism(wanted: int, slots: int, max_parallelism: int) -> int:
    """A parallelism of at least ``wanted`` ranges (one task each) that keeps ``slots`` task slots
    evenly busy and nests in ``wanted``: their least common multiple when it is at most twice the
    larger of the two, else ``wanted`` rounded up to a multiple of ``slots``; at most ``max_parallelism``."""
    _check(max_parallelism, wanted)
    common = math.lcm(wanted, max(1, slots))
    if common > 2 * max(wanted, slots):
        common = -(-wanted // slots) * slots
    return min(common, max_parallelism)


def _check(max_parallelism: int, parallelism: int) -> None:
    if not 1 <= parallelism <= max_parallelism:
        raise ValueError(f"parallelism {parallelism} must be in [1, max_parallelism={max_parallelism}]")
