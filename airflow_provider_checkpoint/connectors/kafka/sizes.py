"""The size of a staged record as the producer counts it, checked in the step against what the topic
and the producer accept: a record the broker would refuse fails its step (the checkpoint is
aborted), never the commit of a completed checkpoint, which could only retry."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.exceptions import SinkSchemaError

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

RECORD_FRAMING = 100
"""Bytes counted per record beside its key, value and headers: a record batch's header (61 bytes) and the
record's own length, offset, timestamp and header-count varints, rounded up."""
PRODUCER_DEFAULT = 1_000_000
"""librdkafka's default ``message.max.bytes``, the producer's limit unless the connection sets it."""


def record_sizes(rows: pa.Table) -> np.ndarray:
    """Per staged record (:func:`~.sink.staged_schema`): key + value + every header's key and value, in bytes,
    plus :data:`RECORD_FRAMING`."""
    import numpy as np
    import pyarrow.compute as pc

    def lengths(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
        return pc.fill_null(pc.binary_length(column), 0).to_numpy(zero_copy_only=False).astype(np.int64)

    sizes = lengths(rows["key"]) + lengths(rows["value"]) + RECORD_FRAMING
    headers = rows["headers"].combine_chunks()
    flat = pc.list_flatten(headers)
    if len(flat):
        per_header = lengths(flat.field("key")) + lengths(flat.field("value"))
        parents = pc.list_parent_indices(headers).to_numpy(zero_copy_only=False)
        sizes += np.bincount(parents, weights=per_header, minlength=rows.num_rows).astype(np.int64)
    return sizes


def check_sizes(
    uid: str, topic: str, rows: pa.Table, topic_limit: int | None, config: Mapping[str, str], connection: str
) -> None:
    """Refuse ``rows`` if a record is larger than the smaller of the topic's ``max.message.bytes``
    (``topic_limit``, ``None`` if the broker did not say) and the producer's ``message.max.bytes``."""
    if rows.num_rows == 0:
        return
    producer = config.get("message.max.bytes", str(PRODUCER_DEFAULT))
    producer_limit = int(producer) if producer.isdigit() else PRODUCER_DEFAULT
    limit = min(producer_limit, topic_limit or producer_limit)
    sizes = record_sizes(rows)
    over = sizes > limit
    said = "not readable" if topic_limit is None else f"{topic_limit:,}"
    if over.any():
        raise SinkSchemaError(
            f"sink {uid}: {int(over.sum())} record(s) of this checkpoint are larger than {limit:,} bytes, the largest "
            f"{int(sizes.max()):,} (key + value + headers + {RECORD_FRAMING} bytes of framing). The limit is the "
            f"smaller of topic {topic}'s max.message.bytes ({said}) "
            f"and the producer's message.max.bytes ({producer_limit:,}, from connection {connection!r}'s extras). "
            "Raise both, or shrink or split those rows upstream; nothing of this checkpoint is published"
        )
