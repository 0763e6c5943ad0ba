"""Tolerable-failure accounting (Flink's CheckpointFailureManager)."""

from __future__ import annotations

import pytest

from airflow_provider_checkpoint.core.failures import FailureAccounting
from airflow_provider_checkpoint.core.status import AbortReason
from tests.unit.helpers import COUNTED, NOT_COUNTED


def test_reason_classification_is_total() -> None:
    assert set(AbortReason) == COUNTED | NOT_COUNTED
    assert not COUNTED & NOT_COUNTED


@pytest.mark.parametrize("reason", sorted(AbortReason), ids=str)
def test_only_counted_reasons_count(reason: AbortReason) -> None:
    acc = FailureAccounting()
    assert reason.counts_as_failure is (reason in COUNTED)
    assert acc.on_abort(1, reason) is (reason in COUNTED)
    assert acc.count == (1 if reason in COUNTED else 0)


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
