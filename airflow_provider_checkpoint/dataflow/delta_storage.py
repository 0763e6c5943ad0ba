"""Where a Delta table lives, for fsspec and delta-rs at once (pure Python, no Spark).

A Delta table takes one set of storage options, as every other location does: ``s3fs``'s
(``key``, ``secret``, ``endpoint_url``, …), an Airflow ``aws`` connection as ``conn_id``, or
nothing (the standard AWS environment). fsspec opens the table with them (the log, staged
files, file checks); delta-rs (``object_store``) names its options differently, so on S3
its options are derived from the filesystem fsspec opened — the same credentials, endpoint
and region, however they were given. Options named ``aws_*`` (``object_store``'s own keys)
go to delta-rs only, and win. On other schemes delta-rs gets the options as given.

On S3 delta-rs creates each commit file with a conditional PUT (``If-None-Match``,
``aws_conditional_put=etag`` unless given): of two writers of one version exactly one wins,
with no lock table — the store must honour conditional PUTs, as for ``_metadata``.
Credentials live only in these options, never in a document or a log.
"""

from __future__ import annotations

import os
from typing import Any

from fsspec import AbstractFileSystem

from airflow_provider_checkpoint.storage.object_store import is_s3

DELTA_RS_PREFIX = "aws_"
"""Options with this prefix (any case) are ``object_store``'s: delta-rs takes them, fsspec does not."""

_FROM_S3FS = (("key", "aws_access_key_id"), ("secret", "aws_secret_access_key"), ("token", "aws_session_token"))


def split_options(storage_options: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, str]]:
    """``storage_options`` as (fsspec's, delta-rs's only)."""
    given = dict(storage_options or {})
    delta_only = {k.lower(): str(v) for k, v in given.items() if k.lower().startswith(DELTA_RS_PREFIX)}
    return {k: v for k, v in given.items() if not k.lower().startswith(DELTA_RS_PREFIX)}, delta_only


def delta_rs_options(
    fs: AbstractFileSystem, fsspec_options: dict[str, Any], delta_only: dict[str, str]
) -> dict[str, str]:
    """The delta-rs options reaching the table's store as ``fs`` (opened with ``fsspec_options``, a
    connection resolved) reaches it, ``delta_only`` (:func:`split_options`) over them."""
    if not is_s3(fs):
        return {**{k: str(v) for k, v in fsspec_options.items()}, **delta_only}
    opened = fs.storage_options
    client = opened.get("client_kwargs") or {}
    options = {name: str(opened[option]) for option, name in _FROM_S3FS if opened.get(option)}
    endpoint = opened.get("endpoint_url") or client.get("endpoint_url")
    if endpoint:
        options["aws_endpoint_url"] = str(endpoint)
    if client.get("region_name"):
        options["aws_region"] = str(client["region_name"])
    used = endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    if str(used).startswith("http://"):
        options["aws_allow_http"] = "true"
    return {**options, "aws_conditional_put": "etag", **delta_only}
