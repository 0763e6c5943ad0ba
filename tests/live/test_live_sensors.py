"""A deferred sensor under the real triggerer: a downstream DAG waits for the pipeline's checkpoint.

``example_downstream`` defers its ``CheckpointCompletedSensor`` to the triggerer (the
task leaves its worker slot, state ``deferred``); only when the pipeline commits its
next checkpoint does the triggerer fire, and ``report`` reads the committed table:
its totals must equal the pandas ground truth over every event landed so far.
"""

from __future__ import annotations

import pytest

from tests.live.airflow_live import LiveAirflow, poll
from tests.live.conftest import Clickstream
from tests.live.storage_view import Deadline

pytestmark = pytest.mark.live

PIPELINE = "example_clickstream"
DOWNSTREAM = "example_downstream"


def test_downstream_waits_deferred_for_the_next_checkpoint(live_airflow: LiveAirflow, clickstream: Clickstream) -> None:
    live = live_airflow
    deadline = Deadline(420.0)
    waiting = live.trigger(DOWNSTREAM, {})
    poll(
        "the downstream sensor to defer to the triggerer",
        lambda: live.task_states(DOWNSTREAM, waiting).get("wait_for_checkpoint") == "deferred",
        deadline.bounded(120.0),
    )

    clickstream.land(250)
    pipeline_run = live.trigger(PIPELINE, {})
    live.wait_for_run(PIPELINE, pipeline_run, timeout=deadline.bounded(360.0))
    live.wait_for_run(DOWNSTREAM, waiting, timeout=deadline.bounded(120.0))

    committed = live.xcom(PIPELINE, pipeline_run, "finalize_checkpoint")["checkpoint_id"]
    report = live.xcom(DOWNSTREAM, waiting, "report")
    truth = clickstream.truth()
    assert report == {"checkpoint_id": committed, "pages": truth["page"].nunique(), "views": len(truth)}
