"""The files of a Parquet table (:class:`~.parquet_sink.ParquetTableSink`): their names, the newest ones an
append step reads the columns of, and the committables that move staged files into place."""

from __future__ import annotations

import posixpath
import re
from typing import Any

from airflow_provider_checkpoint.connectors.base.table_files import Listing, list_names
from airflow_provider_checkpoint.core.documents import Fields, relative_path
from airflow_provider_checkpoint.exceptions import DocumentError
from airflow_provider_checkpoint.storage.job_storage import Location

APPEND_FILE = re.compile(r"^part-c(\d{10})-\d{5}\.parquet$")
"""A file of an append table: ``part-c<checkpoint>-<n>.parquet``."""
_BUCKET_FILE = re.compile(r"^part-b\d{5}\.parquet$")


def table_file_pattern(mode: str, checkpoint_id: int) -> re.Pattern[str]:
    """Names of the committed files of ``checkpoint_id`` in a table of ``mode``."""
    return re.compile(rf"^part-c{checkpoint_id:010d}-\d{{5}}\.parquet$") if mode == "append" else _BUCKET_FILE


APPEND_LISTINGS = (9, 6, 0)
"""How many digits of the checkpoint id before a step's the prefixes of :func:`newest_appended`'s listings
keep: the ten checkpoints around that one, then ten thousand, then the whole table."""


def newest_appended(table: Location, checkpoint_id: int) -> Listing:
    """Committed files of an append table written before checkpoint ``checkpoint_id``, among them the newest
    (the last by name): one LIST of the files of the ten checkpoints whose ids share all but the last digit with
    the one before ``checkpoint_id``, wider ones (:data:`APPEND_LISTINGS`) only when those wrote none, so a
    step's listing does not grow with the table; empty for a table without files."""
    digits = f"{checkpoint_id - 1:010d}"
    for kept in APPEND_LISTINGS:
        listed = list_names(table.fs, table.base, f"part-c{digits[:kept]}")
        older = {
            path: size
            for path, size in listed.items()
            if (m := APPEND_FILE.match(posixpath.basename(path))) and int(m[1]) < checkpoint_id
        }
        if older:
            return older
    return {}


def check_table_committables(
    checkpoint_id: int, committables: Any, mode: str, document: str, field: str = "committables"
) -> list[list[str]]:
    """The moves of ``committables`` if they have exactly the shape :class:`ParquetTableSink` stages.

    ``{"checkpoint_id": <id>, "moves": [[staged, target], ...]}``: ``staged`` lies under
    ``_staging/chk-<id>/``, ``target`` is a file name of the table's own naming scheme for
    ``mode`` (in ``append`` mode a file of checkpoint ``<id>`` or of an earlier one, which a checkpoint adding
    a column rewrites with it), and no target appears twice.
    """
    reader = Fields({field: committables}, document)
    targets = APPEND_FILE if mode == "append" else table_file_pattern(mode, checkpoint_id)
    moves: list[list[str]] = []
    for i, item in enumerate(reader.items(field)):
        c = Fields(item, document, f"{field}[{i}]")
        if c.integer("checkpoint_id", 1) != checkpoint_id:
            raise c.error("checkpoint_id", f"must be {checkpoint_id}", c.raw["checkpoint_id"])
        for j, move in enumerate(c.items("moves")):
            where = f"{field}[{i}].moves[{j}]"
            if not isinstance(move, list) or len(move) != 2:
                raise DocumentError(document, where, "must be [staged, target]", move)
            staged = relative_path(move[0], document, f"{where}[0]", under=f"_staging/chk-{checkpoint_id}")
            target = relative_path(move[1], document, f"{where}[1]", pattern=targets)
            if (written := APPEND_FILE.match(target)) and int(written[1]) > checkpoint_id:
                raise DocumentError(
                    document, f"{where}[1]", f"names a file of a checkpoint after {checkpoint_id}", target
                )
            moves.append([staged, target])
    names = [t for _, t in moves]
    if len(set(names)) != len(names):
        raise DocumentError(document, field, "name a target file twice")
    return moves
