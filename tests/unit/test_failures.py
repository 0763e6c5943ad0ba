"""Tolerable-failure accounting (Flink's CheckpointFailureManager)."""

from __future__ import annotations

import pytest

from airflow_provider_checkpoint.core.failures import AbortReason, FailureAccounting

COUNTED = [
    AbortReason.DECLINED,
    AbortReason.EXPIRED,
    AbortReason.IO_ERROR,
    AbortReason.CORRUPT_STATE,
    AbortReason.FINALIZE_FAILURE,
    AbortReason.ABANDONED,
]
NOT_COUNTED = [
    AbortReason.MIN_PAUSE,
    AbortReason.TOO_MANY_CONCURRENT,
    AbortReason.SUBSUMED,
    AbortReason.JOB_NOT_RUNNING,
]


def test_reason_classification_is_total() -> None:
    assert set(COUNTED) | set(NOT_COUNTED) == set(AbortReason)


@pytest.mark.parametrize("reason", COUNTED)
def test_counted_reasons(reason: AbortReason) -> None:
    acc = FailureAccounting()
    assert acc.on_abort(1, reason) is True
    assert acc.count == 1


@pytest.mark.parametrize("reason", NOT_COUNTED)
def test_non_counted_reasons(reason: AbortReason) -> None:
    acc = FailureAccounting()
    assert acc.on_abort(1, reason) is False
    assert acc.count == 0


def test_each_id_counts_once() -> None:
    acc = FailureAccounting()
    assert acc.on_abort(3, AbortReason.DECLINED)
    assert not acc.on_abort(3, AbortReason.EXPIRED)
    assert not acc.on_abort(3, AbortReason.DECLINED)
    assert acc.on_abort(4, AbortReason.DECLINED)
    assert acc.count == 2


def test_ids_not_newer_than_last_completed_are_ignored() -> None:
    acc = FailureAccounting()
    acc.on_complete(10)
    assert not acc.on_abort(10, AbortReason.DECLINED)
    assert not acc.on_abort(7, AbortReason.EXPIRED)
    assert acc.count == 0
    assert acc.on_abort(11, AbortReason.EXPIRED)
    assert acc.count == 1


def test_completion_resets_the_count() -> None:
    acc = FailureAccounting()
    for i in (1, 2, 3):
        acc.on_abort(i, AbortReason.DECLINED)
    assert acc.count == 3
    acc.on_complete(4)
    assert acc.count == 0
    assert acc.on_abort(5, AbortReason.DECLINED)
    assert acc.count == 1


def test_older_completion_never_moves_last_completed_back() -> None:
    acc = FailureAccounting()
    acc.on_complete(8)
    acc.on_complete(3)
    assert acc.last_completed_id == 8
    assert not acc.on_abort(5, AbortReason.DECLINED)


def test_exceeds_tolerable() -> None:
    acc = FailureAccounting()
    assert not acc.exceeds(0)
    acc.on_abort(1, AbortReason.DECLINED)
    assert acc.exceeds(0)
    assert not acc.exceeds(1)
    acc.on_abort(2, AbortReason.DECLINED)
    assert not acc.exceeds(2)
    acc.on_abort(3, AbortReason.DECLINED)
    assert acc.exceeds(2)


def test_round_trip() -> None:
    acc = FailureAccounting()
    acc.on_complete(2)
    acc.on_abort(3, AbortReason.DECLINED)
    acc.on_abort(5, AbortReason.EXPIRED)
    back = FailureAccounting.from_dict(acc.to_dict())
    assert back.last_completed_id == 2
    assert back.failed_ids == [3, 5]
    assert FailureAccounting.from_dict({}).count == 0
