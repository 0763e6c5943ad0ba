"""The ``[checkpoint]`` section of Airflow's configuration and the storage it names.

Storage root, savepoint roots, the roots UI-given paths may point under, and a job's
:class:`JobStorage` (``s3://`` with an ``aws`` connection, any other scheme through Airflow's
ObjectStoragePath: connections apply).
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from fsspec.core import split_protocol

from airflow_provider_checkpoint.exceptions import CheckpointStorageError, RefusedInputError, shorten
from airflow_provider_checkpoint.storage.job_storage import JobStorage, Location
from airflow_provider_checkpoint.storage.object_store import S3_PROTOCOLS, check_reachable

SECTION = "checkpoint"


def config_value(key: str, fallback: str = "") -> str:
    """A ``[checkpoint]`` option from Airflow's configuration (env ``AIRFLOW__CHECKPOINT__<KEY>``)."""
    from airflow.sdk import conf

    return str(conf.get(SECTION, key, fallback=fallback) or fallback)


def default_storage_root() -> str:
    """``[checkpoint] storage_root``, else ``$AIRFLOW_HOME/checkpoints``."""
    configured = config_value("storage_root")
    if configured:
        return configured
    home = os.environ.get("AIRFLOW_HOME", os.path.expanduser("~/airflow"))
    return f"file://{os.path.abspath(home)}/checkpoints"


def default_savepoint_roots() -> list[str]:
    """``[checkpoint] savepoint_roots`` (comma-separated), else ``$AIRFLOW_HOME/savepoints``."""
    configured = [r.strip() for r in config_value("savepoint_roots").split(",") if r.strip()]
    if configured:
        return configured
    home = os.environ.get("AIRFLOW_HOME", os.path.expanduser("~/airflow"))
    return [f"file://{os.path.abspath(home)}/savepoints"]


LOCAL_SCHEMES = frozenset({"file", "local"})
SERVED_SCHEMES = frozenset({*LOCAL_SCHEMES, "memory", *S3_PROTOCOLS})
"""Schemes the provider opens without being told: local files, fsspec's in-memory filesystem and S3."""


def served_schemes() -> frozenset[str]:
    """:data:`SERVED_SCHEMES` plus ``[checkpoint] storage_schemes`` (comma-separated, e.g. ``gs,abfs``)."""
    extra = {s.strip().lower() for s in config_value("storage_schemes").split(",") if s.strip()}
    return SERVED_SCHEMES | extra


def storage_url_problem(url: str) -> str | None:
    """Why the provider refuses to open the storage URL ``url`` (``None``: it may be opened).

    Checked before any I/O, so a URL from an untrusted place (a registry entry) never makes a
    process connect anywhere: its scheme must be served (:func:`served_schemes`; a plain
    path is ``file``) and it must not carry a password (``user:password@``; credentials come
    from a connection). The reason shows the URL redacted.
    """
    scheme = (split_protocol(url)[0] or "file").lower()
    if scheme not in served_schemes():
        served = ", ".join(sorted(served_schemes()))
        return (
            f"{shorten(url)} has scheme {scheme!r}, which the provider does not open (served: {served}; "
            "add it to [checkpoint] storage_schemes to allow it)"
        )
    if ":" in urlsplit(url).netloc.rpartition("@")[0]:
        return f"{shorten(url)} carries a password: give credentials through a connection (storage_conn_id)"
    return None


def allowed_roots(storage_root: str | None = None) -> list[str]:
    """Where UI-given savepoint and restore paths may point: the savepoint roots and the storage root."""
    return [*default_savepoint_roots(), storage_root or default_storage_root()]


def storage_location(url: str, conn_id: str | None = None) -> Location:
    """The directory ``url``: on ``s3://`` through ``s3fs`` directly, else through Airflow's ObjectStoragePath.

    On S3 the credentials and endpoint come from the ``aws`` connection ``conn_id``
    (:func:`~.object_store.aws_connection_options`), else from the standard environment
    (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``). Not through the
    Amazon provider's filesystem: it caches listings and holds a boto session that does not
    travel to Spark executors. A local path without a connection opens fsspec's local filesystem directly:
    ObjectStoragePath would first load every provider's filesystems (the Amazon provider's imports
    ``boto3``, 0.5 s of every task process). Another scheme takes any connection ObjectStoragePath accepts;
    one no provider registers is served by fsspec directly. An object store is probed once
    (:func:`~.object_store.check_reachable`). A URL :func:`storage_url_problem` refuses raises
    :class:`RefusedInputError` before anything is opened.
    """
    from airflow.sdk import ObjectStoragePath

    problem = storage_url_problem(url)
    if problem is not None:
        raise RefusedInputError(f"storage URL {problem}")
    scheme = split_protocol(url)[0]
    if scheme in S3_PROTOCOLS or (conn_id is None and (scheme or "file") in LOCAL_SCHEMES):
        location = Location.from_url(url, **({} if conn_id is None else {"conn_id": conn_id}))
    else:
        if conn_id is not None:
            _check_connection(conn_id, url)
        try:
            root = ObjectStoragePath(url, conn_id=conn_id)
            location = Location(root.fs, str(root.path).rstrip("/"))
        except (ValueError, ImportError) as e:  # unknown scheme, or its filesystem package is missing
            if conn_id is not None:
                message = f"no filesystem serves {shorten(url)} with connection {conn_id!r}: {e}"
                raise CheckpointStorageError(message) from e
            location = Location.from_url(url)
    check_reachable(location.fs, location.base, url, conn_id)
    return location


def _check_connection(conn_id: str, url: str) -> None:
    """The connection a storage URL names exists (a misspelt one would be ignored on a local root, and a
    sensor would poke on): :class:`CheckpointStorageError` naming it otherwise."""
    from airflow.exceptions import AirflowNotFoundException
    from airflow.sdk import BaseHook

    try:
        BaseHook.get_connection(conn_id)
    except AirflowNotFoundException as e:
        raise CheckpointStorageError(
            f"Airflow connection {conn_id!r} of storage {shorten(url)} is not defined: define it or drop the conn_id"
        ) from e


def job_storage(job_id: str, storage_root: str | None = None, conn_id: str | None = None) -> JobStorage:
    """The storage of ``job_id`` under ``storage_root`` (:func:`storage_location`)."""
    location = storage_location(storage_root or default_storage_root(), conn_id)
    return JobStorage(location.fs, location.base, job_id)
