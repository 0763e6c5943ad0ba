"""A local storage root opens fsspec's local filesystem directly: no provider's filesystem is loaded (the
Amazon provider's would import ``boto3`` in every task process), and a relative root is made absolute."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO

OPEN = """
import json, os, sys
from airflow_provider_checkpoint.storage.config import storage_location
location = storage_location(sys.argv[1])
print(json.dumps({"base": location.base, "protocol": location.fs.protocol,
                  "loaded": sorted(m for m in ("boto3", "botocore", "s3fs") if m in sys.modules)}))
"""


def _open(url: str, cwd: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", OPEN, url], cwd=cwd, env=None, capture_output=True, text=True, check=True, timeout=60
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_local_root_loads_no_object_store_filesystem(tmp_path):
    opened = _open(f"file://{tmp_path}/checkpoints", str(REPO))
    assert opened["loaded"] == []
    assert opened["base"] == f"{tmp_path}/checkpoints"


def test_a_relative_root_is_made_absolute(tmp_path):
    opened = _open("relative/checkpoints", str(tmp_path))
    assert opened["base"] == f"{tmp_path}/relative/checkpoints"
    assert opened["loaded"] == []
