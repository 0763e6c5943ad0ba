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
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from fsspec import AbstractFileSystem

from airflow_provider_checkpoint.connectors.delta import log_checks
from airflow_provider_checkpoint.connectors.delta.log_checks import LOG_DIR, LogState
from airflow_provider_checkpoint.exceptions import UnsafePathError
from airflow_provider_checkpoint.storage.object_store import is_s3
from airflow_provider_checkpoint.storage.paths import confine, is_local

if TYPE_CHECKING:
    from airflow_provider_checkpoint.connectors.delta.log import DataFile

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


def check_table(
    fs: AbstractFileSystem, root: str, table: str, files: Iterable[DataFile] = (), whole: bool = True
) -> LogState | None:
    """What delta-rs, Spark and pyarrow are handed is safe to open: no link in the log and no file linking
    out (:func:`check_links`), no log file delta-rs would read (``whole``: for history and time travel too)
    that would crash it (:func:`.log_checks.check_log`); the log's state, ``None`` for no table."""
    check_links(fs, root, table, files)
    return log_checks.check_log(fs, root, table, whole)


def check_links(fs: AbstractFileSystem, root: str, table: str, files: Iterable[DataFile] = ()) -> None:
    """Refuse, on a local filesystem, a table whose ``_delta_log`` is or holds a symbolic link, or one of
    whose ``files`` (as its log names them: data files and their DV files) resolves outside the table.

    delta-rs reads and creates log files, Spark and pyarrow open data files and DV files by path, and
    each would follow a link: a link anywhere in the log (even one pointing inside) is refused, a data
    or DV file only if it leads out (as every path a document names, docs/security.md). Object stores
    have no links. Checked right before use, not atomically with it."""
    if not is_local(fs):
        return
    log = f"{root}/{LOG_DIR}"
    if os.path.islink(log):
        raise UnsafePathError(f"refusing Delta table {table}: its {LOG_DIR} is a symbolic link")
    if os.path.isdir(log):
        for directory, dirs, names in os.walk(log):
            linked = [n for n in [*dirs, *names] if os.path.islink(os.path.join(directory, n))]
            if linked:
                where = os.path.relpath(os.path.join(directory, linked[0]), root)
                raise UnsafePathError(f"refusing Delta table {table}: {where} is a symbolic link")
    for f in files:
        dv = f.deletion_vector.file() if f.deletion_vector else None
        for path in (f.path, dv) if dv else (f.path,):
            confine(root, path, local=True)
