"""Small real state files for unit tests: Parquet holding the columns of :data:`SCHEMA`."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA = json.dumps(
    {
        "type": "struct",
        "fields": [{"name": n, "type": "string", "nullable": True, "metadata": {}} for n in ("k", "v")],
    }
)
"""The recorded (Spark JSON) schema of :func:`state_file`'s rows: key ``k``, value ``v``."""


def state_file(text: str) -> bytes:
    """A Parquet state file with one row whose value is ``text``."""
    buffer = io.BytesIO()
    pq.write_table(pa.table({"k": ["k"], "v": [text]}), buffer)
    return buffer.getvalue()
