"""What the Delta sink's writer and committer share: the table of one call (:mod:`.opened`), its claim,
its ``txn`` app id and its files."""

from __future__ import annotations

import functools
import json
import posixpath
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Concatenate, ParamSpec, TypeVar

from airflow_provider_checkpoint.connectors.base.sink import CLAIM_FILE, TableDirectorySink
from airflow_provider_checkpoint.connectors.delta import log as delta_log
from airflow_provider_checkpoint.connectors.delta import storage as delta_storage
from airflow_provider_checkpoint.connectors.delta.opened import OpenedTable
from airflow_provider_checkpoint.core.documents import Fields, load_json
from airflow_provider_checkpoint.core.model import JsonDict
from airflow_provider_checkpoint.exceptions import SinkSchemaError

if TYPE_CHECKING:
    from deltalake import DeltaTable

    from airflow_provider_checkpoint.connectors.base.bucketed import BucketedUpsert
    from airflow_provider_checkpoint.connectors.delta.log import DataFile

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S", bound="DeltaTableBase")


def in_call(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
    """Run ``method`` in the sink's :class:`OpenedTable` of the current call (opened here if none is)."""

    @functools.wraps(method)
    def run(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self.opened():
            return method(self, *args, **kwargs)

    return run


class DeltaTableBase(TableDirectorySink):
    """The table side of :class:`~.sink.DeltaTableSink` (see there)."""

    mode: str
    partition_by: list[str]
    upsert: BucketedUpsert | None
    delta_only: dict[str, str]
    _call: OpenedTable | None = None

    @contextmanager
    def opened(self, prepared: OpenedTable | None = None) -> Iterator[OpenedTable]:
        """The table of the current call of the sink: opened by the outermost call (``prepared``: as a
        :mod:`.prepared` stage opened it), dropped when it returns."""
        if self._call is not None:
            yield self._call
            return
        fs, root = self._fs()
        options = delta_storage.delta_rs_options(fs, self.storage_options, self.delta_only)
        self._call = prepared or OpenedTable(fs, root, self.asset_uri(), options)
        try:
            yield self._call
        finally:
            self._call = None

    def _table(self) -> OpenedTable:
        assert self._call is not None, "called outside opened()"
        return self._call

    def _delta(self) -> DeltaTable | None:
        """The Delta table's latest version (as this call first saw it), ``None`` if there is no table yet."""
        return self._table().latest()

    def delta_options(self) -> dict[str, str]:
        """delta-rs's options reaching the table as its filesystem does (:mod:`.storage`)."""
        return delta_storage.delta_rs_options(self._fs()[0], self.storage_options, self.delta_only)

    @in_call
    def load_claim(self) -> JsonDict | None:
        """The table's claim, read once per call (one request)."""
        opened = self._table()
        if not opened.has_claim():
            location = self.table()
            try:
                data = location.fs.cat_file(location.path(CLAIM_FILE), start=0)  # one GET: no HEAD first
            except FileNotFoundError:
                opened.claim = None
            else:
                opened.claim = load_json(data, location.url(CLAIM_FILE))
        claim: JsonDict | None = opened.claim
        return claim

    @in_call
    def store_claim(self, claim: JsonDict) -> None:
        self.table().write_atomic(CLAIM_FILE, json.dumps(claim, sort_keys=True).encode())
        self._table().claim = claim

    def app_id(self) -> str | None:
        """The ``txn`` app id of this (bound job, sink); ``None`` before the first stage (no claim yet).
        A claim naming another job or sink is refused (:meth:`owned_claim`)."""
        if self.owned_claim(self.load_claim()) is None:
            return None
        return f"airflow-checkpoint:{self.job_id}:{self.uid}"

    @in_call
    def check_target(self) -> None:
        """Refuse a directory that holds anything but a Delta table (and this sink's claim and files)."""
        fs, root = self._fs()
        if self._table().state() is not None or not fs.exists(root):
            return
        foreign = sorted(
            name
            for name in (posixpath.basename(p.rstrip("/")) for p in fs.ls(root, detail=False))
            if name != CLAIM_FILE and not name.startswith("chk-")
        )
        if foreign:
            raise SinkSchemaError(f"{self.asset_uri()} is not a Delta table (no _delta_log) but holds {foreign[:5]}")

    def _files(self, version: int | None = None) -> dict[str, DataFile]:
        """The live files of the table (at ``version``) with their deletion vectors, from its log."""
        return self._snapshot(version).files

    def _snapshot(self, version: int | None = None) -> delta_log.Snapshot:
        """The table (at ``version``) from its log: :func:`.log.snapshot_at`, its files' links checked."""
        fs, root = self._fs()
        snapshot = delta_log.snapshot_at(fs, root, self.asset_uri(), version)
        delta_storage.check_links(fs, root, self.asset_uri(), snapshot.files.values())
        return snapshot

    @in_call
    def committed_versions(self) -> dict[int, int]:
        """Checkpoint id → the Delta version that committed it, from the table's history (the whole log)."""
        app_id, table = self.app_id(), self._table().whole_log()
        if app_id is None or table is None:
            return {}
        versions: dict[int, int] = {}
        for entry in table.history():
            if entry.get("checkpoint_app_id") == app_id and entry.get("operation") != "RESTORE":
                f = Fields(entry, f"{self.asset_uri()} commit info")
                versions.setdefault(f.integer("checkpoint_id", 1), f.integer("version"))
        return versions
