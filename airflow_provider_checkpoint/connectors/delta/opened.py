"""A Delta table as one call of the sink sees it: opened once, its log checked once.

Each of the sink's entry points (a stage, a commit, a restore, an abort, an audit, a commit
record) runs in one :class:`OpenedTable`, opened on first use and dropped when the call
returns: within it the filesystem, the claim (``_table.json``), the log check
(:func:`.log_checks.check_log`) and delta-rs's ``DeltaTable`` are each made once, and the
next call (the next task: Airflow runs each in a fresh process) starts afresh, so a foreign
writer's commit, a replaced claim or a damaged log is seen by the next call as before.

delta-rs is opened at the version the check listed, never at "the latest": a commit made
after the check is not read by delta-rs before it is checked (:meth:`OpenedTable.advance`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.connectors.delta import storage as delta_storage
from airflow_provider_checkpoint.connectors.delta.log_checks import LOG_DIR, LogState
from airflow_provider_checkpoint.connectors.delta.lookups import ReadAhead
from airflow_provider_checkpoint.exceptions import DocumentError

if TYPE_CHECKING:
    import fsspec
    from deltalake import DeltaTable

    from airflow_provider_checkpoint.connectors.delta.log import Snapshot

_LOG_DAMAGE = ("Kernel error", "Invalid", "JSON", "Parquet error", "Arrow error", "Protocol")
"""Words of delta-rs errors about the log's content (not its storage)."""
_UNSET: Any = object()


@dataclass(frozen=True)
class Prepared:
    """What a stage's preparation read ahead (:mod:`.prepared`): the latest snapshot and what it read of live files
    (none if not read ahead)."""

    snapshot: Snapshot
    read: ReadAhead = field(default_factory=ReadAhead)


class OpenedTable:
    """The table at ``url`` (``root`` on ``fs``) for one call; ``options``: delta-rs's storage options."""

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str, url: str, options: dict[str, str]) -> None:
        self.fs, self.root, self.url, self.options = fs, root, url, options
        self.claim: Any = _UNSET
        """The claim read in this call (``None``: none), :data:`_UNSET` before it is read."""
        self._table: DeltaTable | None = None
        self._state: LogState | None = None
        self._checked = False
        self._whole = False
        self.prepared: Prepared | None = None
        """What a preparation of this call's stage read ahead (:mod:`.prepared`), if the stage took one."""

    def has_claim(self) -> bool:
        return self.claim is not _UNSET

    def state(self) -> LogState | None:
        """The log as this call first checked it (links and log, :func:`.storage.check_table`); ``None``: no
        table yet."""
        if not self._checked:
            self._state = delta_storage.check_table(self.fs, self.root, self.url, whole=False)
            self._checked = True
        return self._state

    def latest(self) -> DeltaTable | None:
        """delta-rs's table at the version :meth:`state` checked, ``None`` if there is no table yet."""
        state = self.state()
        if self._table is None and state is not None:
            self._table = self.load(state.version)
        return self._table

    def created(self, table: DeltaTable) -> DeltaTable:
        """The table this call just created: the one used from now on."""
        self._table, self._checked = table, False
        return table

    def whole_log(self) -> DeltaTable | None:
        """:meth:`latest`, with every file of the log checked (history, time travel, ``RESTORE``)."""
        table = self.latest()
        if table is not None and not self._whole:
            delta_storage.check_table(self.fs, self.root, self.url, whole=True)
            self._whole = True
        return table

    def advance(self) -> DeltaTable:
        """The table at its latest version after a commit of this call: the log checked again, then delta-rs
        opened at that version (only then, if this call had not opened it) or the commits since read by it."""
        self._state = delta_storage.check_table(self.fs, self.root, self.url, whole=False)
        self._checked = True
        assert self._state is not None  # a commit needs a table
        if self._table is None:
            self._table = self.load(self._state.version)
        elif self._state.version != self._table.version():
            with self.log_errors():
                self._table.load_as_version(self._state.version)
        return self._table

    def load(self, version: int | None = None) -> DeltaTable:
        """delta-rs's table at ``version`` (checked first by the caller)."""
        from deltalake import DeltaTable

        with self.log_errors():
            return DeltaTable(self.url, version=version, storage_options=self.options)

    @contextmanager
    def log_errors(self) -> Iterator[None]:
        """A log delta-rs cannot read is a :class:`DocumentError` naming the table (its storage failing stays
        delta-rs's error, so the task is retried)."""
        from deltalake.exceptions import DeltaError

        try:
            yield
        except DeltaError as e:
            message = str(e)
            if not any(m in message for m in _LOG_DAMAGE):
                raise
            raise DocumentError(
                f"Delta table {self.url}",
                LOG_DIR,
                f"cannot be read by delta-rs ({message[:300]}): a commit, checkpoint or _last_checkpoint file "
                "is damaged; restore it, or restore the job to a checkpoint on a new table path",
            ) from None
