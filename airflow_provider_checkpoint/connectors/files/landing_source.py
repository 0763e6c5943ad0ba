"""A file source's landing directory: its files listed, cut into barrier positions and checked unchanged before
they are read, and the processed ones cleaned once their checkpoint committed (no Spark).
:class:`~.source.FileSource` reads them."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import fsspec

from airflow_provider_checkpoint.connectors.files import positions as file_positions
from airflow_provider_checkpoint.connectors.files.landing import Listing, clean_file, list_landing
from airflow_provider_checkpoint.storage.job_storage import Location
from airflow_provider_checkpoint.storage.paths import owned_path

if TYPE_CHECKING:
    from airflow_provider_checkpoint.dataflow.context import StepContext

log = logging.getLogger(__name__)


class LandingFiles:
    """The landing directory of a file source (:class:`~.source.FileSource` sets these attributes): which files a
    checkpoint reads, and what becomes of them after it."""

    uid: str
    path: str
    pattern: str
    storage_options: dict[str, Any]
    max_files_per_checkpoint: int | None
    clean_source: str
    archive_dir: str | None
    partition_pattern: str | None
    partition_lateness: timedelta

    def filesystem(self) -> tuple[fsspec.AbstractFileSystem, str]:
        """The filesystem of the landing directory and its path on it."""
        landing = Location.from_url(self.path, **self.storage_options)
        return landing.fs, landing.base

    def listing(self, partition_floor: datetime | None = None) -> Listing:
        """Visible files now present (partitions before ``partition_floor`` not listed)."""
        fs, root = self.filesystem()
        missing = FileNotFoundError(f"source {self.uid}: landing directory {self.path} does not exist")
        try:
            listing = list_landing(fs, root, self.pattern, self.partition_pattern, partition_floor)
        except FileNotFoundError as e:
            raise missing from e
        if not listing.files and not listing.partitions and not fs.exists(root):  # asked only when it matters
            raise missing
        return listing

    def list_files(self, partition_floor: datetime | None = None) -> dict[str, int]:
        """Visible files now present, relative name → size."""
        return {name: size for name, (size, _) in self.listing(partition_floor).files.items()}

    def initial_position(self) -> dict[str, Any]:
        return {"files": {}}

    def barrier_position(self, previous: Any) -> dict[str, Any]:
        processed = file_positions.validate_position(self.uid, previous)
        listing = self.listing(processed.partition_floor)
        return file_positions.next_position(
            processed,
            listing.files,
            self.max_files_per_checkpoint,
            listing.partitions if self.partition_pattern else None,
            self.partition_lateness,
        )

    def split(self, previous: Any, barrier: Any) -> dict[str, int]:
        """The files in ``[previous, barrier)``: in the barrier, not yet processed (validated)."""
        return file_positions.split(
            file_positions.validate_position(self.uid, previous).files,
            file_positions.validate_position(self.uid, barrier).files,
        )

    def input_bytes(self, previous: Any, barrier: Any) -> int:
        """The sizes of the files in ``[previous, barrier)``, as the barrier recorded them."""
        return sum(self.split(previous, barrier).values())

    def on_checkpoint_committed(self, checkpoint_id: int, position: Any) -> None:
        """``clean_source``: archive or delete the processed files of a committed position.

        Only files still present with the size they were read at are touched, so running
        it again (recovery after a crash) or for an older position changes nothing. A file
        or archive path that resolves (through a link) out of its directory is refused.
        """
        if self.clean_source == "off":
            return
        processed = file_positions.validate_position(self.uid, position)
        visible = self.listing(processed.partition_floor).files
        fs, root = self.filesystem()
        done: dict[str, int] = {}
        for name, size in processed.files.items():
            if name in visible and visible[name][0] == size:
                outcome = clean_file(fs, owned_path(fs, root, name), size, self._archive_target(name))
                done[outcome] = done.get(outcome, 0) + 1
        if done.pop("kept", 0):
            log.warning("source %s: files whose archive copy differs were left in %s", self.uid, self.path)
        for outcome, count in done.items():
            log.info("source %s: %s %d file(s) read up to checkpoint %d", self.uid, outcome, count, checkpoint_id)

    def _archive_target(self, name: str) -> tuple[fsspec.AbstractFileSystem, str] | None:
        if self.archive_dir is None:
            return None
        archive = Location.from_url(self.archive_dir, **self.storage_options)
        return archive.fs, archive.path(name)

    def url(self, relative: str) -> str:
        fs, root = self.filesystem()
        protocol = fs.protocol[0] if isinstance(fs.protocol, tuple) else fs.protocol
        protocol = "file" if protocol in ("file", "local") else protocol
        return f"{protocol}://{root}/{relative}"

    def checked(self, ctx: StepContext, todo: dict[str, int], barrier: Any) -> dict[str, int]:
        """``todo``, its files checked unchanged since the barrier was cut (:meth:`check_unchanged`) by one listing
        per step attempt: a read after another (Spark's, after the driver's declined) lists no more."""
        if ctx.unchanged.get(self.uid) != todo:
            self.check_unchanged(todo, barrier)
            ctx.unchanged[self.uid] = dict(todo)
        return todo

    def check_unchanged(self, todo: dict[str, int], barrier: Any) -> None:
        """Raise if a file of ``todo`` changed size since the barrier was cut (it would break exactly-once)."""
        if todo:
            now = self.list_files(file_positions.validate_position(self.uid, barrier).partition_floor)
            file_positions.check_unchanged(self.uid, todo, now, self.url)
