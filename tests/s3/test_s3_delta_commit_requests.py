"""How many S3 requests a DeltaTableSink's finalize (one checkpoint's commit) makes, from the server's
own access log: every client's requests (fsspec's and delta-rs's) are counted.

The commit runs as a finalize does, in a fresh process's state (no log file parsed yet). The bounds
hold the measured figures with a little room (a request logged late may count in the next window): a
commit that opens delta-rs before it writes (its ``_last_checkpoint`` and log checkpoint, ~14
requests) or for its log checkpoint after it (~30: the open at the new version, then
``create_checkpoint``, which reads the log again) fails them. What is left: the claim, the log check
(listing, ``_last_checkpoint``, the previous log checkpoint), the commit's replay (that checkpoint
again), the listing of the staged files, the commit file, our own log checkpoint and
``_last_checkpoint`` (read, then written).
"""

from __future__ import annotations

import io
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_checkpoint.connectors.delta import log_checks
from airflow_provider_checkpoint.connectors.delta.sink import DeltaTableSink
from airflow_provider_checkpoint.dataflow.graph import Source
from tests.servers.s3 import AccessLog, S3Server

ROWS = pa.table({"k": pa.array(["a", "b"]), "v": pa.array([1, 2], pa.int64()), "p": pa.array(["x", "y"])})
APPEND_REQUESTS = 11
"""Requests of an append's finalize (2 partitions): measured 51 (GET 36, LIST 10, HEAD 2, PUT 3) opening
delta-rs before the commit and committing with its transaction API; 42 (GET 33, LIST 5, HEAD 1, PUT 3)
with our own commit file, delta-rs opened after it for the log checkpoint only (its 30 requests: the
open, then ``create_checkpoint`` reading the log again), log checkpoints read in one GET (no HEAD),
the first attempt on the log check's listing and our own commit file not read back; 10 (GET 5, LIST 2,
PUT 3) with our own log checkpoint written from the commit's log replay (delta-rs not opened)."""
UPSERT_REQUESTS = 11
"""Requests of an upsert's finalize that removes a file and adds one: measured 49 (GET 35, LIST 8, HEAD 3,
PUT 3) opening delta-rs before the commit; 42 (GET 33, LIST 5, HEAD 1, PUT 3) after; 10 (GET 5, LIST 2,
PUT 3) with our own log checkpoint."""


def _delta_options(server: S3Server) -> dict[str, str]:
    return {
        "aws_access_key_id": server.key,
        "aws_secret_access_key": server.secret,
        "aws_endpoint_url": server.endpoint,
        "aws_region": "us-east-1",
        "aws_allow_http": "true",
        "aws_conditional_put": "etag",
    }


def _stage(server: S3Server, url: str, relative: str, rows: pa.Table) -> dict[str, Any]:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **server.storage_options())
    buffer = io.BytesIO()
    pq.write_table(rows, buffer)
    data = buffer.getvalue()
    fs.pipe_file(f"{url.removeprefix('s3://')}/{relative}", data)
    values = {"p": rows.column("p")[0].as_py()} if "=" in relative else {}
    return {"path": relative, "size": len(data), "num_records": rows.num_rows, "partition_values": values}


def _finalize(sink: DeltaTableSink, access: AccessLog, checkpoint_id: int, committables: Any) -> Counter[str]:
    """The requests of one finalize of ``checkpoint_id``, as in a fresh process."""
    log_checks._parsed.clear()
    sink._records = {}
    access.since()
    sink.commit(checkpoint_id, committables)
    requests = access.since()
    return Counter(r.kind for r in requests)


def _sink(server: S3Server, name: str, **kwargs: Any) -> tuple[DeltaTableSink, str]:
    from deltalake import DeltaTable

    url = server.url(name)
    sink = DeltaTableSink("t", Source("src"), url, storage_options=server.storage_options(), **kwargs)
    sink.claim("job")
    schema = ROWS.schema if kwargs.get("mode") != "upsert" else ROWS.drop_columns(["p"]).schema
    configuration = {"delta.enableDeletionVectors": "true"} if kwargs.get("mode") == "upsert" else None
    partition_by = kwargs.get("partition_by")
    DeltaTable.create(
        url, schema, partition_by=partition_by, storage_options=_delta_options(server), configuration=configuration
    )
    return sink, url


def test_an_append_finalize_makes_few_requests(logged_s3: tuple[S3Server, AccessLog]) -> None:
    from deltalake import DeltaTable

    server, access = logged_s3
    sink, url = _sink(server, "append", partition_by=["p"])
    counts = []
    for checkpoint_id in (1, 2, 3):
        adds = [
            _stage(server, url, f"chk-{checkpoint_id}/job/step/attempt-1/p={v}/part-00000.parquet", ROWS[i : i + 1])
            for i, v in enumerate(["x", "y"])
        ]
        committables = [{"checkpoint_id": checkpoint_id, "adds": adds, "removes": []}]
        counts.append(_finalize(sink, access, checkpoint_id, committables))
        assert sink.is_committed(checkpoint_id)
    print("append finalize requests:", [dict(c) for c in counts], [c.total() for c in counts])
    assert counts[-1].total() <= APPEND_REQUESTS, counts[-1]
    table = DeltaTable(url, storage_options=_delta_options(server))
    assert table.transaction_version("airflow-checkpoint:job:t") == 3
    assert sorted(table.to_pyarrow_table().column("k").to_pylist()) == ["a", "a", "a", "b", "b", "b"]
    assert table.metadata().partition_columns == ["p"]
    assert sink.commit_record(3)["t"]["delta_version"] == 3


def test_an_upsert_finalize_makes_few_requests(logged_s3: tuple[S3Server, AccessLog]) -> None:
    from deltalake import DeltaTable

    server, access = logged_s3
    sink, url = _sink(server, "upsert", mode="upsert", keys=["k"], buckets=1)
    rows = ROWS.drop_columns(["p"])
    counts = []
    previous = None
    for checkpoint_id in (1, 2, 3):
        add = _stage(server, url, f"chk-{checkpoint_id}/job/step/attempt-1/part-b00000.parquet", rows)
        removes = [{"path": previous["path"], "size": previous["size"]}] if previous else []
        committables = [{"checkpoint_id": checkpoint_id, "adds": [add], "removes": removes}]
        counts.append(_finalize(sink, access, checkpoint_id, committables))
        previous = add
    print("upsert finalize requests:", [dict(c) for c in counts], [c.total() for c in counts])
    assert counts[-1].total() <= UPSERT_REQUESTS, counts[-1]
    table = DeltaTable(url, storage_options=_delta_options(server))
    assert table.transaction_version("airflow-checkpoint:job:t") == 3
    assert sorted(pa.table(table.scan()).column("k").to_pylist()) == ["a", "b"]  # scan() applies DVs
