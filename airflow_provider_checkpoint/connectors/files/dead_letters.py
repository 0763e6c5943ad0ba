"""Dead letters: the malformed records of a source, committed with the checkpoint that read them.

A source with ``on_malformed="dead_letter"`` passes its good records on and brings along a
:class:`DeadLetterSink`: an append-mode :class:`~.parquet_sink.ParquetTableSink` staged in the step
that reads the source and committed by finalize with every other sink (two-phase commit,
exactly once). One row per malformed record, columns :data:`COLUMNS`.
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import fsspec

from airflow_provider_checkpoint.connectors.files.parquet_sink import ParquetTableSink
from airflow_provider_checkpoint.core.model import JsonDict
from airflow_provider_checkpoint.dataflow.graph import Source

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from airflow_provider_checkpoint.dataflow.context import StepContext

SCHEMA = "source STRING, file STRING, line LONG, raw STRING, error STRING, checkpoint_id LONG"
"""The dead-letter table: source uid, file (relative to the landing directory), line number
in the file (1-based; null if the record spans lines), the raw text, why it is malformed,
and the checkpoint that read it."""
COLUMNS = ("source", "file", "line", "raw", "error", "checkpoint_id")


class DeadLetterSink(ParquetTableSink):
    """The dead-letter table of one source: ``<path>`` in append mode, one job and sink per table.

    It runs last in the step that reads the source (so the source's one pass has counted
    the malformed records) and stages nothing but a commit log when there are none.
    """

    follows_input = True
    record_kind = "dead_letters"

    def __init__(
        self,
        source: Source,
        path: str,
        letters: Callable[[StepContext], DataFrame | None],
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        """``letters``: the source's malformed records of a checkpoint as :data:`SCHEMA` rows, ``None`` if none."""
        super().__init__(f"{source.uid}.dead_letters", source, path, storage_options=storage_options)
        self.letters = letters

    def check_input(self, df: DataFrame) -> None:
        """The table against the dead-letter columns (:data:`SCHEMA`), whatever the source's records are."""
        super().check_input(df.sparkSession.createDataFrame([], SCHEMA))

    def write(self, ctx: StepContext, df: DataFrame) -> list[JsonDict]:
        """Stage the source's malformed records of this checkpoint (``df``, its good records, is not used)."""
        letters = self.letters(ctx)
        if letters is None:
            return [{"checkpoint_id": ctx.checkpoint_id, "moves": []}]
        return super().write(ctx, letters.coalesce(1))


def locate(fs: fsspec.AbstractFileSystem, path: str, malformed: Iterable[str]) -> list[tuple[int | None, str]]:
    """``(line number, raw text)`` of each malformed record of the file at ``path``, in file order.

    Spark gives the raw text, not the line: the file is scanned once and each line whose text
    is a not yet located malformed record is one (parsing is deterministic, so a text is
    malformed wherever it occurs). Records spanning lines are not found and get ``None``.
    """
    wanted = Counter(r.rstrip("\r\n") for r in malformed)
    found: list[tuple[int | None, str]] = []
    with fs.open(path, "rt", encoding="utf-8", errors="replace", compression="infer") as f:
        for number, line in enumerate(f, start=1):
            text = line.rstrip("\r\n")
            if wanted[text] > 0:
                wanted[text] -= 1
                found.append((number, text))
    return found + [(None, raw) for raw, n in sorted(wanted.items()) for _ in range(n)]


def locate_all(
    fs: fsspec.AbstractFileSystem, malformed: Iterable[tuple[str, str]]
) -> list[tuple[str, int | None, str]]:
    """``(path, line number, raw text)`` of ``(path, raw text)`` malformed records, by file and line."""
    by_file: dict[str, list[str]] = {}
    for path, raw in malformed:
        by_file.setdefault(path, []).append(raw)
    return [(path, line, raw) for path in sorted(by_file) for line, raw in locate(fs, path, by_file[path])]


def reason(format: str, raw: str, schema: str, columns: int, options: dict[str, str]) -> str:
    """Why ``raw`` is a malformed ``format`` record under ``schema`` (of ``columns`` columns), as far
    as Python can tell."""
    mismatch = f"does not match schema <{schema}>"
    if format == "json":
        try:
            value = json.loads(raw)
        except ValueError as e:
            return f"not valid JSON: {e}"
        return mismatch if isinstance(value, dict) else f"not a JSON object: {type(value).__name__}"
    separator = options.get("sep", options.get("delimiter", ","))
    fields = next(csv.reader([raw], delimiter=separator), [])
    if len(fields) != columns:
        return f"has {len(fields)} fields, schema <{schema}> has {columns}"
    return f"a field {mismatch}"
