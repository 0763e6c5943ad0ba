"""State files whose columns differ from their _metadata are refused with a clear error, before any effect.

Files are crafted in a job directory and in a savepoint with a valid size and checksum in
``_metadata``, so only the column check can catch them: ``read_state`` (pyarrow and
Spark), a restore request, the savepoint copy and a step that loads the state must all
raise :class:`StateFileError` naming the file, the operator and the column.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from urllib.parse import quote

import pyarrow.parquet as pq
import pytest

from airflow_provider_checkpoint.core import metadata
from airflow_provider_checkpoint.core.status import AbortReason
from airflow_provider_checkpoint.exceptions import CheckpointStorageError, StateFileError
from airflow_provider_checkpoint.restore.requests import read_state, request_restore
from airflow_provider_checkpoint.spark.acks import decline_for
from airflow_provider_checkpoint.state.savepoints import write_savepoint
from airflow_provider_checkpoint.storage import Location
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore
from airflow_provider_checkpoint.storage.job_storage import METADATA
from airflow_provider_checkpoint.testing.inprocess import make_job
from tests.spark.orders import HOLD, RETENTION, Landing, changes, enrichment_pipeline

pytestmark = pytest.mark.spark


def drop_column(location: Location, base: Location, column: str) -> str:
    """Rewrite the first state file of ``enrich`` without ``column``, with a matching handle; its URL."""
    cp = location.load_snapshot()
    state = cp.operators["enrich"]
    handle = state.handles[0]
    path = base.path(handle.path)
    pq.write_table(pq.read_table(path).drop_columns([column]), path)
    rewritten = dataclasses.replace(base.handle_for(handle.path, handle.key_groups), delta=handle.delta)
    state = dataclasses.replace(state, handles=(rewritten, *state.handles[1:]))
    location.fs.rm(location.path(METADATA))
    location.write_atomic(METADATA, metadata.encode(dataclasses.replace(cp, operators={"enrich": state})))
    return base.url(handle.path)


def test_state_without_its_key_column_is_refused_everywhere(spark, tmp_path):
    declare = enrichment_pipeline("hold", hold_ttl=HOLD, tombstone_retention=RETENTION)
    job = make_job(spark, tmp_path, declare, inline_state_threshold=0)
    Landing(tmp_path, seed=3).land(1, 6, changes(("c0", "gold", 1, "U"), ("c1", "x", 1, "D")))
    savepoint = tmp_path / "savepoints" / "sp-1"
    job.checkpoint(savepoint_target=f"file://{savepoint}")
    sp = Location.from_url(f"file://{savepoint}")
    for location, base in ((job.storage.checkpoint_location(1), job.storage), (sp, sp)):
        pointer = location.url()
        file = drop_column(location, base, "customer_id")
        expected = rf"state file {re.escape(file)} of operator 'enrich' .*missing column\(s\) \['customer_id'\]"
        for session in (None, spark):
            with pytest.raises(StateFileError, match=expected + ", among them declared key"):
                read_state(pointer, "enrich", spark=session)
        with pytest.raises(StateFileError, match=expected):
            request_restore(job.storage, pointer, False, False)
        assert not job.storage.exists("_restore.json")
    assert issubclass(StateFileError, CheckpointStorageError)

    target = Location.from_url(f"file://{tmp_path}/savepoints/sp-2")
    with pytest.raises(StateFileError, match="missing column"):  # the savepoint copy writes nothing
        write_savepoint(job.storage, CompletedCheckpointStore(job.storage).load(1), target)
    assert not Path(target.base).exists()

    with pytest.raises(StateFileError, match=r"operator 'enrich' .*missing column\(s\) \['customer_id'\]"):
        job.checkpoint()  # the step restores the latest checkpoint's state


def claim_one_key_group(location: Location) -> str:
    """Make ``enrich``'s state file claim key group 0 only (the issue's crafted handle), in a valid
    ``_metadata``: its size and checksum still match; its URL."""
    cp = location.load_snapshot()
    state = cp.operators["enrich"]
    assert [h.key_groups for h in state.handles] == [(0, 127)], "one file of every key group"
    state = dataclasses.replace(state, handles=(dataclasses.replace(state.handles[0], key_groups=(0, 0)),))
    location.fs.rm(location.path(METADATA))
    location.write_atomic(METADATA, metadata.encode(dataclasses.replace(cp, operators={"enrich": state})))
    return location.url(state.handles[0].path)


def test_a_state_file_holding_keys_outside_its_key_group_range_is_refused(spark, tmp_path):
    declare = enrichment_pipeline("hold", hold_ttl=HOLD, tombstone_retention=RETENTION)
    job = make_job(spark, tmp_path, declare, inline_state_threshold=0)
    landing = Landing(tmp_path, seed=5)
    landing.land(1, 40, changes(*[(f"c{i}", "gold", 1, "U") for i in range(8)]))
    savepoint = tmp_path / "savepoints" / "sp-1"
    job.checkpoint(savepoint_target=f"file://{savepoint}")
    sp = Location.from_url(f"file://{savepoint}")
    file = claim_one_key_group(sp)
    request_restore(job.storage, sp.url(), False, False)  # columns, sizes and checksums all match
    outputs = {p: p.read_bytes() for p in (tmp_path / "marts").rglob("*") if p.is_file()}

    landing.land(2, 5, changes(("c1", "x", 2, "U")))
    with pytest.raises(Exception) as raised:
        job.checkpoint()  # the step restores the savepoint's state: Spark reads every row of the file
    found = raised.value  # the step names the checkpoint and operator that read the file
    refused = found if isinstance(found, StateFileError) else StateFileError.raised_by_spark(found)
    assert refused is not None, raised.value
    named = re.escape(quote(file.removeprefix("file://").lstrip("/")))
    assert re.fullmatch(
        rf"checkpoint 2, reading the state of 'enrich': state file file:/+{named} holds a key of key group \d+, "
        rf"outside the range its handle "
        rf"records \[0, 0\]: it is not the file the checkpoint wrote; restore another checkpoint or savepoint",
        str(refused),
    ), str(refused)
    declined = decline_for(raised.value)
    want = (AbortReason.CORRUPT_STATE, True, f"StateFileError: {refused}")  # the reason names its class
    assert (declined.reason, declined.fatal, str(declined)) == want
    assert CompletedCheckpointStore(job.storage).completed_ids() == [1], "nothing committed"
    assert {p: p.read_bytes() for p in (tmp_path / "marts").rglob("*") if p.is_file()} == outputs
