"""Table URLs (the sinks' Asset URIs, the sources' landing check) made from the path alone."""

from __future__ import annotations

import posixpath
import subprocess
import sys

import fsspec
import pytest

from airflow_provider_checkpoint.connectors.base.table_urls import table_url

S3_PATHS = [
    "s3://bucket/table",
    "s3://bucket/table/",
    "s3://bucket//deep///table//",
    "s3a://bucket/a/../b/./c",
    "s3://bucket",
    "s3://bucket/",
    "s3a://bucket/x?versionId=1",
    "s3://s3a://bucket/t",
    "s3a://s3://bucket/t",
    "s3a://bucket/t/?a=1&b=2",
    "s3://bucket/t#fragment",
    "s3://",
    "s3://bucket/with space/ünïcode",
]


@pytest.mark.parametrize("path", S3_PATHS)
def test_an_s3_url_is_what_s3fs_s_own_rules_make_it(path: str) -> None:
    kind = fsspec.get_filesystem_class("s3")  # imports s3fs: the answer table_url must give without it
    want = f"{kind.protocol[0]}://{posixpath.normpath(kind._strip_protocol(path)).rstrip('/')}"
    assert table_url("t", path) == want


def test_declaring_an_s3_sink_does_not_import_s3fs() -> None:
    code = (
        "import sys\n"
        "from airflow_provider_checkpoint.dataflow import DeltaTableSink, FileSource, ParquetTableSink\n"
        "from airflow_provider_checkpoint.dataflow.graph import collecting\n"
        "with collecting():\n"
        "    src = FileSource('events', 's3://landing/events', format='json', schema='user STRING')\n"
        "    sinks = [ParquetTableSink('p', src, 's3://lake/p', mode='append'),\n"
        "             DeltaTableSink('d', src, 's3a://lake/d/', mode='append')]\n"
        "print([s.asset_uri() for s in sinks], 's3fs' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["['s3://lake/p',", "'s3://lake/d']", "False"], out
