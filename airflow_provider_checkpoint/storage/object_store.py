"""Object stores (``s3://`` through fsspec's ``s3fs``): connection options, a first-contact probe, clear errors.

Credentials and the endpoint come from the storage options, an Airflow ``aws`` connection
(storage option ``conn_id``) or the standard AWS environment (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``, profiles);
they are never written into documents or logs — errors name the URL, never the options.
Listings are not cached (another process may have written since), and retries are
bounded: throttling (HTTP 503 SlowDown) and connection errors are retried a few times
with backoff, then surface as errors.
"""

from __future__ import annotations

import asyncio
import copy
import io
import logging
import os
import posixpath
import time
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar, cast

from fsspec import AbstractFileSystem
from fsspec.asyn import sync

from airflow_provider_checkpoint.exceptions import CheckpointStorageError, RefusedInputError

T = TypeVar("T")
S3_PROTOCOLS = frozenset({"s3", "s3a"})
S3_DEFAULTS: dict[str, Any] = {
    "use_listings_cache": False,
    "config_kwargs": {"retries": {"max_attempts": 3, "mode": "standard"}, "connect_timeout": 5, "read_timeout": 60},
}
"""Options :func:`with_defaults` adds for ``s3://`` unless given: fresh listings, bounded retries and timeouts."""


CHATTY_LOGGERS = (
    "botocore.credentials",
    "aiobotocore.credentials",
    "botocore.configprovider",
    "airflow.providers.amazon.aws.utils.connection_wrapper",
)
"""Loggers that say at INFO, on every new client or connection lookup, where credentials and endpoint came from."""


def with_defaults(protocol: str, storage_options: dict[str, Any]) -> dict[str, Any]:
    """``storage_options`` with the defaults of ``protocol``'s filesystem filled in, and a ``conn_id``
    option replaced by the options of that Airflow connection (:func:`aws_connection_options`).

    For S3 it also quiets :data:`CHATTY_LOGGERS` to WARNING unless their level was set:
    their INFO lines would interleave with every task log and the CLI's JSON output.
    """
    conn_id = storage_options.get("conn_id")
    if protocol not in S3_PROTOCOLS:
        if conn_id is not None:
            raise RefusedInputError(
                f"storage option conn_id={conn_id!r} applies to s3:// locations (an 'aws' connection), "
                f"not {protocol}://: give that filesystem's own options"
            )
        return storage_options
    for name in CHATTY_LOGGERS:
        if logging.getLogger(name).level == logging.NOTSET:
            logging.getLogger(name).setLevel(logging.WARNING)
    if conn_id is None:
        return {**S3_DEFAULTS, **storage_options}
    given = {k: v for k, v in storage_options.items() if k != "conn_id"}
    return {**S3_DEFAULTS, **aws_connection_options(str(conn_id)), **given}


CONNECTION_TTL_SECONDS = 60.0
"""How long a process reuses the options it resolved from a connection (a step opens its
locations many times; each resolution builds a boto session and logs where the credentials came from)."""
_resolved: dict[str, tuple[float, dict[str, Any]]] = {}


def aws_connection_options(conn_id: str) -> dict[str, Any]:
    """``s3fs`` options from the Airflow connection ``conn_id`` of type ``aws`` (Amazon provider).

    The credentials are those the provider's hook resolves (login/password, a profile or a
    role the connection assumes, else the standard AWS environment), frozen now and reused
    by this process for :data:`CONNECTION_TTL_SECONDS`; the endpoint is the connection's
    ``endpoint_url`` (extra, or ``service_config.s3``), the region its ``region_name``. They
    live only in the filesystem's options, which reach executors inside pickled tasks
    (:func:`for_executors`) and are never written out. Temporary credentials of an assumed
    role last as long as that role's session.
    """
    found = _resolved.get(conn_id)
    if found is None or time.monotonic() - found[0] >= CONNECTION_TTL_SECONDS:
        found = _resolved[conn_id] = (time.monotonic(), _resolve_connection(conn_id))
    return copy.deepcopy(found[1])


def _resolve_connection(conn_id: str) -> dict[str, Any]:
    try:
        from airflow.exceptions import AirflowNotFoundException
        from airflow.providers.amazon.aws.hooks.s3 import S3Hook
    except ImportError as e:
        raise CheckpointStorageError(
            f"Airflow connection {conn_id!r} for s3:// needs the Amazon provider: "
            "pip install 'airflow-provider-checkpoint[s3]'"
        ) from e
    hook = S3Hook(aws_conn_id=conn_id)
    try:
        conn_type = hook.get_connection(conn_id).conn_type
    except AirflowNotFoundException as e:
        raise CheckpointStorageError(f"Airflow connection {conn_id!r} is not defined") from e
    if conn_type != "aws":
        raise CheckpointStorageError(f"Airflow connection {conn_id!r} has type {conn_type!r}, not 'aws'")
    found = hook.get_session().get_credentials()
    options: dict[str, Any] = {}
    if found is not None:
        credentials = found.get_frozen_credentials()
        options.update(key=credentials.access_key, secret=credentials.secret_key)
        if credentials.token:
            options["token"] = credentials.token
    endpoint = hook.conn_config.get_service_endpoint_url(service_name="s3")
    if endpoint:
        options["endpoint_url"] = endpoint
    if hook.conn_config.region_name:
        options["client_kwargs"] = {"region_name": hook.conn_config.region_name}
    return options


def precondition_failed(error: BaseException) -> bool:
    """Whether ``error`` is an object store's refusal of a conditional request (HTTP 412)."""
    response = getattr(error.__cause__, "response", None)
    if not isinstance(response, dict):
        return False
    code = response.get("Error", {}).get("Code")
    return code in ("PreconditionFailed", "412") or response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 412


PROBE_TIMEOUTS = {"connect_timeout": 5, "read_timeout": 10}
"""Upper bounds of the first-contact probe's timeouts; it tries twice, without s3fs's own retries."""


def _probe(fs: AbstractFileSystem) -> AbstractFileSystem:
    """A client of ``fs``'s store that gives up within seconds: an endpoint that accepts connections
    but never answers fails the probe in at most ~2 × 10 s, not after every layer's retries of
    :data:`S3_DEFAULTS` (5 × 4 reads of 60 s)."""
    options = dict(fs.storage_options)
    config = dict(options.get("config_kwargs") or {})
    for name, bound in PROBE_TIMEOUTS.items():
        config[name] = min(config.get(name, bound), bound)
    config["retries"] = {"max_attempts": 2, "mode": "standard"}
    probe = share_loader(type(fs)(**{**options, "config_kwargs": config, "skip_instance_cache": True}))
    probe.retries = 1  # s3fs's own loop around botocore's, a class attribute
    return probe


def check_reachable(fs: AbstractFileSystem, base: str, url: str, conn_id: str | None = None) -> None:
    """Raise :class:`CheckpointStorageError` naming ``url`` and the likely fix unless its bucket answers.

    One ``HeadBucket`` request on S3, within :data:`PROBE_TIMEOUTS`; nothing for other filesystems.
    ``conn_id``: the Airflow connection the credentials and endpoint came from, named as the fix.
    """
    if not is_s3(fs):
        return
    bucket = base.split("/", 1)[0]
    keys = "storage options key/secret, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or the AWS profile"
    endpoint = "storage option endpoint_url or AWS_ENDPOINT_URL"
    if conn_id is not None:
        keys = endpoint = f"Airflow connection {conn_id!r}"
    try:
        _probe(fs).call_s3("head_bucket", Bucket=bucket)
    except PermissionError as e:
        raise CheckpointStorageError(
            f"access to {url} denied ({e}): check the access key and secret ({keys}) "
            "and that they may read and write the bucket"
        ) from e
    except FileNotFoundError as e:
        raise CheckpointStorageError(f"bucket {bucket!r} of {url} does not exist: create it first") from e
    except Exception as e:  # botocore's connection and timeout errors share no base with the above
        raise CheckpointStorageError(
            f"cannot reach the object store of {url} ({type(e).__name__}: {e}): check the endpoint "
            f"({endpoint}) and the network"
        ) from e


_LOADER: list[Any] = []
"""The botocore data loader every S3 client of this process shares (:func:`share_loader`), once made."""


def share_loader(fs: AbstractFileSystem) -> AbstractFileSystem:
    """``fs``, which on S3 builds its client from a botocore session whose data loader is this process's one.

    Every S3 filesystem of a process (the job storage, a source's landing area, a sink's table, the
    first-contact probe) otherwise loads the S3 service model and endpoint rules again: 0.2-0.8 s per
    client on a busy machine, paid in every task process; with the shared loader a client after the first
    costs ~10-30 ms. The loader holds only those files: each filesystem keeps a session of its own, so
    credentials, profile and endpoint are resolved for it as before (from its options, else the
    environment at that time). Not applied to a filesystem that already connected or was given a session;
    executors build their own.
    """
    if not is_s3(fs) or getattr(fs, "session", None) is not None or getattr(fs, "_s3", None) is not None:
        return fs
    from aiobotocore.session import AioSession

    session = AioSession(**dict(getattr(fs, "kwargs", {})))
    if _LOADER:
        session.register_component("data_loader", _LOADER[0])
    else:
        _LOADER.append(session.get_component("data_loader"))
    fs.session = session
    return fs


def is_s3(fs: AbstractFileSystem) -> bool:
    return bool(S3_PROTOCOLS & set(fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)))


def read_object(fs: AbstractFileSystem, path: str) -> bytes:
    """The whole file ``path``: one GET on S3 (s3fs's ``cat_file`` asks for the size first, and lists
    the parent when the file is missing); :class:`FileNotFoundError` when it does not exist."""
    if is_s3(fs):
        return bytes(fs.cat_file(path, max_concurrency=1))
    return bytes(fs.cat_file(path))


CONCURRENT_REQUESTS = 16
"""How many requests :func:`read_objects` and :func:`call_s3_each` have in flight at once."""


def read_objects(fs: AbstractFileSystem, paths: Sequence[str]) -> dict[str, bytes | None]:
    """Each whole file of ``paths``, ``None`` for one that does not exist: on S3 one GET each, up to
    :data:`CONCURRENT_REQUESTS` at once (one round trip's time for a few small documents); elsewhere in turn.
    Every read has ended when it returns; the first error other than a missing file is raised then."""
    if not is_s3(fs) or len(paths) < 2:
        return {path: _read_or_none(fs, path) for path in paths}

    async def one(path: str) -> bytes | None:
        try:
            return bytes(await fs._cat_file(path, max_concurrency=1))
        except FileNotFoundError:
            return None

    return dict(zip(paths, _each(fs, [one(path) for path in paths]), strict=True))


def call_s3_each(fs: AbstractFileSystem, method: str, requests: Sequence[dict[str, Any]]) -> None:
    """The S3 API call ``method`` once with each of ``requests`` (its parameters), up to
    :data:`CONCURRENT_REQUESTS` at once, for calls that do not depend on each other's order; every call
    has ended when it returns, and the first error is raised then."""
    _each(fs, [fs._call_s3(method, **request) for request in requests])


def _each(fs: AbstractFileSystem, calls: list[Coroutine[Any, Any, T]]) -> list[T]:
    async def gather() -> list[T | BaseException]:
        limit = asyncio.Semaphore(CONCURRENT_REQUESTS)

        async def bounded(call: Coroutine[Any, Any, T]) -> T:
            async with limit:
                return await call

        return await asyncio.gather(*(bounded(call) for call in calls), return_exceptions=True)

    results = sync(fs.loop, gather)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return cast(list[T], results)


def _read_or_none(fs: AbstractFileSystem, path: str) -> bytes | None:
    try:
        return read_object(fs, path)
    except FileNotFoundError:
        return None


WHOLE_READ_BYTES = 64 << 20
"""A file of a known size up to this many bytes is read from an object store in one GET."""


def open_sized(fs: AbstractFileSystem, path: str, size: int | None = None) -> Any:
    """``path`` opened to read. On S3, a file whose ``size`` is known (from a handle) and at most
    :data:`WHOLE_READ_BYTES` comes in one GET, no HEAD first: a Parquet reader's seeks to the footer and
    back then cost no request. At most ``size`` bytes are read: the object's first ``size`` bytes if it
    is larger, all of it if smaller (the caller's checks see either)."""
    if size is None or size > WHOLE_READ_BYTES or not is_s3(fs):
        return fs.open(path, "rb")
    return io.BytesIO(fs.cat_file(path, start=0, end=size) if size else b"")


def file_exists(fs: AbstractFileSystem, path: str) -> bool:
    """Whether the file ``path`` exists: one HEAD on S3, where ``fs.exists`` lists as well to find a directory."""
    if not is_s3(fs):
        return bool(fs.exists(path))
    bucket, key, _ = fs.split_path(path)
    try:
        fs.call_s3("head_object", Bucket=bucket, Key=key)
    except FileNotFoundError:
        return False
    return True


def find_prefixed(fs: AbstractFileSystem, directory: str, prefix: str) -> dict[str, Any]:
    """Every file and directory below ``directory`` whose name there starts with ``prefix``, as
    ``find(detail=True, withdirs=True)`` answers: on S3 one listing (a page per 1,000 keys), the
    server filtering by prefix; elsewhere a listing of ``directory`` and a walk of each match."""
    if is_s3(fs):
        try:
            found: dict[str, Any] = fs.find(directory, prefix=prefix, withdirs=True, detail=True)
        except FileNotFoundError:
            return {}
        return {p: info for p, info in found.items() if p.startswith(f"{directory}/{prefix}")}
    try:
        entries = fs.ls(directory, detail=True)
    except FileNotFoundError:
        return {}
    found = {}
    for entry in entries:
        name = entry["name"].rstrip("/")
        if not posixpath.basename(name).startswith(prefix):
            continue
        found[name] = entry
        if entry["type"] == "directory":
            found.update(fs.find(name, withdirs=True, detail=True))
    return found


def delete_objects(fs: AbstractFileSystem, path: str, owner: str) -> None:
    """Delete the object ``path`` or every object under ``path/`` on S3, with their directory markers.

    Stores backed by a file tree (SeaweedFS) keep a directory after its objects are gone,
    and listings would still show it: the ``<dir>/`` keys under ``path`` and of its
    ancestors below ``owner`` are deleted too, deepest first. Such a store keeps a
    directory that is not empty; S3 ignores keys that do not exist. One listing (by the prefix
    ``path``, so that nothing there costs no HEAD and second listing), then (if it found
    anything) bulk DELETEs of at most 1000 keys.
    """
    parent, name = posixpath.split(path)
    listed = fs.find(parent, prefix=name, withdirs=True, detail=True)
    found = {p: info for p, info in listed.items() if p == path or p.startswith(f"{path}/")}
    if not found:
        return
    parents = []
    parent = posixpath.dirname(path)
    while parent.startswith(owner.rstrip("/") + "/"):
        parents.append(parent)
        parent = posixpath.dirname(parent)
    delete_listed(fs, found, parents)


def delete_listed(fs: AbstractFileSystem, found: dict[str, Any], parents: list[str] | None = None) -> None:
    """Delete on S3 the files and directory markers of ``found`` (a ``find(detail=True, withdirs=True)``
    answer or part of one), then the markers ``parents`` (deepest first): the files, then the markers,
    in bulk DELETEs of at most 1000 keys (one request when they fit). Nothing to delete: no request."""
    files = sorted(p for p, info in found.items() if info["type"] != "directory")
    markers = sorted((p for p, info in found.items() if info["type"] == "directory"), key=lambda p: -p.count("/"))
    keys = files + [f"{m}/" for m in markers + (parents or [])]
    if not keys:
        return
    bucket = keys[0].split("/", 1)[0]
    for start in range(0, len(keys), 1000):
        objects = [{"Key": key.split("/", 1)[1]} for key in keys[start : start + 1000]]
        fs.call_s3("delete_objects", Bucket=bucket, Delete={"Objects": objects, "Quiet": True})


_ENVIRONMENT_OPTIONS = (
    ("key", "AWS_ACCESS_KEY_ID"),
    ("secret", "AWS_SECRET_ACCESS_KEY"),
    ("token", "AWS_SESSION_TOKEN"),
    ("endpoint_url", "AWS_ENDPOINT_URL"),
)


def for_executors(fs: AbstractFileSystem) -> AbstractFileSystem:
    """``fs`` as Spark executors should open it: on S3 without credentials in its options, those of the
    standard AWS environment variables here (the driver's) are added, so executors whose own
    environment lacks them (a local session started earlier, a cluster) reach the same store.

    The filesystem travels pickled inside Spark tasks: its options are never written to a
    document or a log. Without those variables ``fs`` is returned unchanged and executors find
    credentials their own way (profile, instance role).
    """
    if not is_s3(fs):
        return fs
    options = dict(fs.storage_options)
    added = {o: os.environ[v] for o, v in _ENVIRONMENT_OPTIONS if o not in options and os.environ.get(v)}
    if "key" in options or "key" not in added:
        added = {o: v for o, v in added.items() if o == "endpoint_url"}
    if not added:
        return fs
    return share_loader(type(fs)(*fs.storage_args, **{**options, **added, "skip_instance_cache": True}))
