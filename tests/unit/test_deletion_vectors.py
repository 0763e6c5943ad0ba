"""Deletion vectors as the Delta protocol lays them out (no Spark)."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_checkpoint.connectors.delta import deletion_vectors as dv
from airflow_provider_checkpoint.connectors.delta import log as delta_log
from airflow_provider_checkpoint.core.documents import Fields
from airflow_provider_checkpoint.exceptions import DocumentError

LOCAL = fsspec.filesystem("file")


def test_z85_matches_the_zeromq_reference_vector():
    raw = bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])
    assert dv.z85_encode(raw) == "HelloWorld" and dv.z85_decode("HelloWorld") == raw
    assert dv.z85_decode("Hello") is not None and dv.z85_decode("Hell~") is None and dv.z85_decode("abc") is None


@pytest.mark.parametrize(
    "positions",
    [
        [0],
        list(range(5000)),  # a bitmap container
        [3, 65536, 65537, 2**32 - 1, 2**32, 2**33 + 7],  # several containers and 32-bit bitmaps
    ],
)
def test_bitmaps_round_trip(positions):
    values = np.asarray(positions, dtype=np.uint64)
    assert np.array_equal(dv.deserialize(dv.serialize(values), "dv"), values)
    inline = dv.inline(values)  # Z85 in the log, padded to whole words
    assert inline.file() is None and len(inline.path_or_inline) % 5 == 0
    assert np.array_equal(dv.read_positions(LOCAL, "/nonexistent", inline, "dv"), values)


def test_run_containers_of_other_writers_are_read():
    runs = struct.pack("<I", dv._RUNS) + b"\x01" + struct.pack("<HH", 0, 4) + struct.pack("<HHH", 1, 5, 4)
    data = struct.pack("<iq", dv.MAGIC, 1) + struct.pack("<i", 0) + runs
    assert dv.deserialize(data, "dv").tolist() == [5, 6, 7, 8, 9]


def _table(tmp_path: Path, deleted: list[int]) -> tuple[Path, str]:
    """A 10-row Delta table written by hand; commit 1 gives its one file a DV deleting ``deleted``."""
    path, name = tmp_path / "t", "part-0.parquet"
    (path / "_delta_log").mkdir(parents=True)
    pq.write_table(pa.table({"k": pa.array(range(10), pa.int64())}), path / name)
    stored, dv_file = dv.new_descriptor_path("chk-2/job/step/attempt-1")
    (path / dv_file).parent.mkdir(parents=True)
    (descriptor,) = dv.write_file(LOCAL, str(path / dv_file), stored, [np.asarray(deleted, dtype=np.uint64)])
    add = {"path": name, "size": (path / name).stat().st_size, "partitionValues": {}, "modificationTime": 1}
    add |= {"dataChange": True, "stats": json.dumps({"numRecords": 10})}
    schema = {"type": "struct", "fields": [{"name": "k", "type": "long", "nullable": True, "metadata": {}}]}
    metadata = {"id": "t", "format": {"provider": "parquet", "options": {}}, "schemaString": json.dumps(schema)}
    features = {"readerFeatures": ["deletionVectors"], "writerFeatures": ["deletionVectors"]}
    commits = [
        [
            {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, **features}},
            {"metaData": {**metadata, "partitionColumns": [], "configuration": {}}},
            {"add": add},
        ],
        [
            {"remove": {"path": name, "deletionTimestamp": 1, "dataChange": True, "size": add["size"]}},
            {"add": {**add, "deletionVector": descriptor.to_json()}},
        ],
    ]
    for version, actions in enumerate(commits):
        (path / "_delta_log" / f"{version:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))
    return path, name


def test_the_log_replay_finds_the_deletion_vector_of_a_file(tmp_path):
    """(delta-rs and DuckDB decoding our DVs: tests/spark/test_delta_sink.py, their first use takes seconds.)"""
    path, name = _table(tmp_path, [1, 3, 7])
    (live,) = delta_log.snapshot(LOCAL, str(path), "t").values()
    assert live.path == name and live.deletion_vector is not None and live.num_records == 10
    assert dv.read_positions(LOCAL, str(path), live.deletion_vector, "t").tolist() == [1, 3, 7]
    (before,) = delta_log.snapshot(LOCAL, str(path), "t", 0).values()
    assert before.path == name and before.deletion_vector is None


def test_corrupt_deletion_vectors_are_refused(tmp_path):
    path, _ = _table(tmp_path, [1, 3, 7])
    (live,) = delta_log.snapshot(LOCAL, str(path), "t").values()
    descriptor = live.deletion_vector
    assert descriptor is not None and descriptor.file() is not None
    file = path / str(descriptor.file())
    good = file.read_bytes()
    file.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    with pytest.raises(DocumentError, match="checksum"):
        dv.read_positions(LOCAL, str(path), descriptor, "t")
    bad_magic = struct.pack("<iq", 7, 0)
    file.write_bytes(b"\x01" + struct.pack(">i", len(bad_magic)) + bad_magic + struct.pack(">I", zlib.crc32(bad_magic)))
    with pytest.raises(DocumentError, match="magic"):
        dv.read_positions(LOCAL, str(path), dv.Descriptor("u", descriptor.path_or_inline, 1, len(bad_magic), 3), "t")
    file.write_bytes(good)
    with pytest.raises(DocumentError, match="cardinality"):
        dv.read_positions(LOCAL, str(path), dv.Descriptor("u", descriptor.path_or_inline, 1, descriptor.size, 4), "t")
    uuid_chars = descriptor.path_or_inline[-20:]
    refused = [
        {"storageType": "p", "pathOrInlineDv": "/etc/passwd", "offset": 1, "sizeInBytes": 1, "cardinality": 1},
        {"storageType": "u", "pathOrInlineDv": "../x" + uuid_chars, "offset": 1, "sizeInBytes": 1, "cardinality": 1},
        {"storageType": "u", "pathOrInlineDv": "short", "offset": 1, "sizeInBytes": 1, "cardinality": 1},
        {"storageType": "u", "pathOrInlineDv": uuid_chars, "offset": -1, "sizeInBytes": 1, "cardinality": 1},
    ]
    for raw in refused:
        with pytest.raises(DocumentError):
            dv.read_descriptor(Fields(raw, "log"))
            pytest.fail(str(raw))
