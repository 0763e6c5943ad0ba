"""Key-group ranges: a partition of [0, max_parallelism), consistent both ways."""

from __future__ import annotations

import pytest

from airflow_provider_checkpoint.state.keygroups import index_for_key_group, range_for_index

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
