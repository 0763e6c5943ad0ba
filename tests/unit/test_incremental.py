"""The layout of incremental state and its compaction policy (pure Python, milliseconds)."""

from __future__ import annotations

import pytest

from airflow_provider_checkpoint.core.settings import CheckpointSettings
from airflow_provider_checkpoint.state import driver_merge, incremental
from airflow_provider_checkpoint.state.handles import InlineState, OperatorSnapshot, StateHandle
from airflow_provider_checkpoint.state.incremental import StateLayout, merge_order, ranges_for
from airflow_provider_checkpoint.state.keygroups import range_for_index

MAXP = 128


def handle(checkpoint: int, index: int, ranges: int, size: int = 100, delta: bool = False) -> StateHandle:
    kind = "delta" if delta else "kgr"
    path = f"chk-{checkpoint}/s/attempt-1/state/op/{kind}/kgr={index}/part-0.parquet"
    return StateHandle(
        path, size, "sha256:" + "0" * 64, range_for_index(MAXP, ranges, index), checkpoint if delta else None
    )


def snapshot(*handles: StateHandle, rows: int = 1000) -> OperatorSnapshot:
    return OperatorSnapshot(tuple(handles), "{}", ("k",), MAXP, rows)


def test_layout_groups_files_by_range_with_deltas_oldest_first() -> None:
    layout = StateLayout.of(
        snapshot(handle(1, 0, 2), handle(1, 1, 2), handle(3, 1, 2, delta=True), handle(2, 1, 2, delta=True))
    )
    assert layout is not None and layout.parallelism == 2
    assert [h.delta for h in layout.ranges[1].deltas] == [2, 3]
    assert layout.ranges[0].deltas == () and layout.ranges[1].delta_count == 2


def test_a_range_without_rows_has_no_file_and_is_still_a_range() -> None:
    layout = StateLayout.of(snapshot(handle(1, 0, 4), handle(1, 3, 4)))
    assert layout is not None and layout.parallelism == 4
    assert layout.ranges[1].handles == () and layout.ranges[3].base


@pytest.mark.parametrize(
    "state",
    [
        OperatorSnapshot((), "{}", ("k",), MAXP, 0),  # no files
        OperatorSnapshot((), "{}", ("k",), MAXP, 3, InlineState.of(b"x")),  # inline
        snapshot(StateHandle("chk-1/x.parquet", 1, "sha256:" + "0" * 64)),  # no key groups
        snapshot(  # ranges of no single parallelism
            StateHandle("chk-1/a.parquet", 1, "sha256:" + "0" * 64, (0, 9)),
            StateHandle("chk-1/b.parquet", 1, "sha256:" + "0" * 64, (5, 127)),
        ),
    ],
)
def test_state_that_cannot_be_continued_incrementally(state: OperatorSnapshot) -> None:
    assert StateLayout.of(state) is None


def test_compaction_is_due_by_size_or_by_count() -> None:
    by_size = StateLayout.of(snapshot(handle(1, 0, 1, size=100), handle(2, 0, 1, size=101, delta=True)))
    assert by_size is not None and by_size.to_compact(compaction_ratio=1.0, max_deltas=32) == [0]
    by_count = StateLayout.of(snapshot(handle(1, 0, 1, size=10_000), *[handle(c, 0, 1, 1, True) for c in range(2, 5)]))
    assert by_count is not None
    assert by_count.to_compact(compaction_ratio=1.0, max_deltas=4) == [0]  # a 4th delta would pass the bound
    assert by_count.to_compact(compaction_ratio=1.0, max_deltas=5) == []


def test_compactions_spread_over_checkpoints() -> None:
    """Ranges changing at the same pace: each checkpoint compacts at most one early, so they fall due apart."""
    ranges, max_deltas = 4, 8
    files = [handle(1, i, ranges, size=10_000) for i in range(ranges)]
    compacted_per_checkpoint = []
    for checkpoint in range(2, 40):
        layout = StateLayout.of(snapshot(*files))
        assert layout is not None
        chosen = layout.to_compact(compaction_ratio=1.0, max_deltas=max_deltas)
        compacted_per_checkpoint.append(len(chosen))
        written = {i: [handle(checkpoint, i, ranges, 10, True)] for i in range(ranges) if i not in chosen}
        compacted = {i: [handle(checkpoint, i, ranges, 10_000)] for i in chosen}
        files = list(layout.handles_after(written, compacted))
        assert all(r.delta_count < max_deltas for r in StateLayout.of(snapshot(*files)).ranges)  # type: ignore[union-attr]
    steady = compacted_per_checkpoint[8:]  # once the first round has staggered the ranges
    assert max(steady) == 1, compacted_per_checkpoint
    assert sum(steady) >= len(steady) * ranges // max_deltas, compacted_per_checkpoint


def test_a_grown_state_is_rewritten_with_more_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(incremental, "RANGE_ROWS", 100)
    assert ranges_for(0, MAXP) == 1 and ranges_for(250, MAXP) == 3 and ranges_for(10**9, MAXP) == MAXP
    layout = StateLayout.of(snapshot(handle(1, 0, 1)))
    assert layout is not None
    assert not layout.due_for_full_version(300) and layout.due_for_full_version(301)
    assert not layout.wants_more_ranges(300) and layout.wants_more_ranges(301)


def test_a_full_version_is_written_when_every_range_is_due() -> None:
    """Most keys change every checkpoint: a full version is cheaper than merging deltas in."""
    one_due = StateLayout.of(snapshot(handle(1, 0, 2), handle(1, 1, 2), handle(2, 1, 2, size=200, delta=True)))
    all_due = StateLayout.of(snapshot(*[handle(c, i, 2, size=200, delta=c == 2) for c in (1, 2) for i in (0, 1)]))
    assert one_due is not None and one_due.to_compact() == [1] and not one_due.due_for_full_version(1000)
    assert all_due is not None and all_due.due_for_full_version(1000)
    assert not all_due.wants_more_ranges(1000)  # a small state's driver merge compacts them instead


def test_merge_order_reads_full_versions_then_deltas_by_checkpoint() -> None:
    files = (handle(5, 0, 1, delta=True), handle(1, 0, 1), handle(3, 0, 1, delta=True))
    base, deltas = merge_order(files)
    assert [h.delta for h in base] == [None] and [c for c, _ in deltas] == [3, 5]


def test_a_merge_on_the_driver_is_bounded_by_the_state_s_rows_then_the_input_s_bytes():
    """:func:`~.driver_merge.within_driver_bounds`: a later merge needs the restored state's rows known and at most
    ``driver_merge_rows``, then (the input's size asked only then) an input of at most ``DRIVER_INPUT_BYTES``; a first
    state an input of at most that, or of at most ``FIRST_STATE_INPUT_BYTES`` into rows estimated (or not yet known)
    at most ``driver_merge_rows``; never with ``driver_merge_rows`` 0."""
    small, large = driver_merge.DRIVER_INPUT_BYTES, driver_merge.FIRST_STATE_INPUT_BYTES
    settings, asked = CheckpointSettings(driver_merge_rows=10), list[int | None]()

    def within(rows: int | None, size: int | None, first: bool, config: CheckpointSettings = settings) -> bool:
        return driver_merge.within_driver_bounds(config, rows, lambda: asked.append(size) or size, first)

    assert within(10, small, False) and within(0, 0, False)
    assert not within(10, small + 1, False) and not within(10, None, False)
    asked.clear()
    assert not within(11, 1, False) and not within(None, 1, False) and asked == []
    assert (
        within(None, small, True) and within(11, small, True) and within(None, large, True) and within(10, large, True)
    )
    assert not within(11, large, True) and not within(None, large + 1, True) and not within(None, None, True)
    assert not within(0, 0, False, CheckpointSettings(driver_merge_rows=0))
    assert not within(None, 0, True, CheckpointSettings(driver_merge_rows=0))
