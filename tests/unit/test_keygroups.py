"""Key-group ranges: a partition of [0, max_parallelism), consistent both ways."""

from __future__ import annotations

import pytest

from airflow_provider_checkpoint.state.keygroups import (
    balanced_parallelism,
    coarsest_nesting,
    index_for_key_group,
    range_for_index,
)

PAIRS = [
    (128, 1),
    (128, 3),
    (128, 7),
    (128, 128),
    (128, 100),
    (1, 1),
    (10, 3),
    (10, 4),
    (97, 13),
    (32768, 7),
]


@pytest.mark.parametrize(("max_p", "p"), PAIRS)
def test_ranges_partition_all_key_groups_exactly(max_p: int, p: int) -> None:
    seen: list[int] = []
    previous_end = -1
    for index in range(p):
        start, end = range_for_index(max_p, p, index)
        assert start == previous_end + 1, "ranges must be contiguous and in index order"
        assert start <= end, "every partition owns at least one key group when p <= max"
        seen.extend(range(start, end + 1))
        previous_end = end
    assert seen == list(range(max_p)), "each key group exactly once"


@pytest.mark.parametrize(("max_p", "p"), PAIRS)
def test_ranges_are_balanced(max_p: int, p: int) -> None:
    sizes = {end - start + 1 for start, end in (range_for_index(max_p, p, i) for i in range(p))}
    assert sizes <= {max_p // p, -(-max_p // p)}


@pytest.mark.parametrize(("max_p", "p"), PAIRS)
def test_index_for_key_group_matches_range_for_index(max_p: int, p: int) -> None:
    for index in range(p):
        start, end = range_for_index(max_p, p, index)
        for kg in range(start, end + 1):
            assert index_for_key_group(max_p, p, kg) == index


def test_known_values() -> None:
    # 128 key groups over 3 partitions: 43 + 43 + 42 (ceil-based split, as in Flink).
    assert [range_for_index(128, 3, i) for i in range(3)] == [(0, 42), (43, 85), (86, 127)]
    assert range_for_index(128, 1, 0) == (0, 127)
    assert [range_for_index(128, 128, i) for i in (0, 5, 127)] == [(0, 0), (5, 5), (127, 127)]


@pytest.mark.parametrize(
    ("max_p", "p", "index"),
    [(128, 3, 3), (128, 3, -1), (128, 0, 0), (128, 129, 0), (0, 1, 0)],
)
def test_range_for_index_rejects_bad_arguments(max_p: int, p: int, index: int) -> None:
    with pytest.raises(ValueError):
        range_for_index(max_p, p, index)


@pytest.mark.parametrize(("max_p", "p", "kg"), [(128, 3, 128), (128, 3, -1), (128, 200, 5)])
def test_index_for_key_group_rejects_bad_arguments(max_p: int, p: int, kg: int) -> None:
    with pytest.raises(ValueError):
        index_for_key_group(max_p, p, kg)


@pytest.mark.parametrize(
    ("max_p", "fine", "at_most"), [(128, 128, 6), (128, 16, 4), (128, 12, 5), (97, 13, 13), (10, 7, 3)]
)
def test_coarsest_nesting_groups_whole_ranges_and_is_the_largest(max_p: int, fine: int, at_most: int) -> None:
    """Every span (a file's range) lies in one range of the result, and no larger parallelism up to
    ``at_most`` has that property (brute force over the key groups)."""
    spans = [range_for_index(max_p, fine, i) for i in range(0, fine, 2)]  # a range without rows has no file

    def nests(p: int) -> bool:
        return all(index_for_key_group(max_p, p, lo) == index_for_key_group(max_p, p, hi) for lo, hi in spans)

    got = coarsest_nesting(max_p, spans, at_most)
    assert 1 <= got <= at_most and nests(got)
    assert not any(nests(p) for p in range(got + 1, at_most + 1))
    if fine % at_most == 0:
        assert got == at_most  # an even split of the spans' ranges nests


@pytest.mark.parametrize(
    ("wanted", "slots", "expected"),
    [(3, 2, 6), (4, 2, 4), (12, 2, 12), (1, 2, 2), (5, 4, 8), (3, 16, 16)]
    + [(7, 16, 16), (1, 1, 1), (100, 3, 102), (127, 2, 128)],
)
def test_balanced_parallelism_keeps_every_slot_busy_and_nests(wanted: int, slots: int, expected: int) -> None:
    """At least ``wanted`` ranges, a multiple of ``slots`` (no slot idle in the last wave) and, where
    that costs at most twice the ranges, of ``wanted`` too: the ranges group back into ``wanted``."""
    got = balanced_parallelism(wanted, slots, 128)
    assert got == expected
    assert got >= wanted and (got % slots == 0 or got == 128)
    spans = [range_for_index(128, got, i) for i in range(got)]
    if got % wanted == 0:
        assert coarsest_nesting(128, spans, wanted) == wanted
