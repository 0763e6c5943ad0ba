"""File sources: a landing directory whose files are each processed exactly once."""

from __future__ import annotations

import fnmatch
import posixpath
from typing import TYPE_CHECKING, Any

import fsspec

from airflow_provider_checkpoint.dataflow.graph import PipelineDefinitionError, Source

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from airflow_provider_checkpoint.spark.context import StepContext

_CORRUPT = "_corrupt_record"
_FORMATS = ("json", "csv", "parquet")


class MalformedInputError(ValueError):
    """Input records do not match the source's format or schema; the message names file and line."""


class InputChangedError(MalformedInputError):
    """A file cut into the barrier changed or vanished before the step read it."""


def _hidden(relative: str) -> bool:
    return any(part.startswith((".", "_")) for part in relative.split("/"))


class FileSource(Source):
    """Files landing in a directory (recursively), in ``json`` (JSON Lines), ``csv`` or ``parquet``.

    The barrier is the set of files present at trigger time; the position is the set of
    files already processed, with their sizes. Each file is processed by exactly one
    completed checkpoint, also when files arrive while a checkpoint runs (they belong to
    the next barrier). Files whose name or directory starts with ``.`` or ``_`` are
    ignored: writers should land files under such a name and rename them when complete.
    A file that changes size after it was cut into a barrier fails the step with a clear
    error, because it would break exactly-once.

    Malformed records (not parseable, or not matching ``schema``) fail the step with an
    error naming the file and line; nothing of that checkpoint is committed, and the next
    run proceeds once the file is fixed or removed.
    """

    def __init__(
        self,
        uid: str,
        path: str,
        format: str,
        schema: str,
        pattern: str = "*",
        options: dict[str, str] | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(uid)
        if format not in _FORMATS:
            raise PipelineDefinitionError(f"{uid}: format must be one of {_FORMATS}, got {format!r}")
        self.path = path
        self.format = format
        self.schema = schema
        self.pattern = pattern
        self.options = dict(options or {})
        self.storage_options = dict(storage_options or {})

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "path": self.path, "format": self.format}

    # -- positions (no Spark) ----------------------------------------------------------
    def _fs(self) -> tuple[fsspec.AbstractFileSystem, str]:
        fs, root = fsspec.core.url_to_fs(self.path, **self.storage_options)
        return fs, root.rstrip("/")

    def list_files(self) -> dict[str, int]:
        """Visible files now present, relative name → size."""
        fs, root = self._fs()
        if not fs.exists(root):
            raise FileNotFoundError(f"source {self.uid}: landing directory {self.path} does not exist")
        found: dict[str, int] = {}
        for full, info in fs.find(root, detail=True).items():
            rel = full[len(root) + 1 :]
            if (
                info.get("type") == "file"
                and not _hidden(rel)
                and fnmatch.fnmatch(posixpath.basename(rel), self.pattern)
            ):
                found[rel] = int(info["size"])
        return found

    def initial_position(self) -> dict[str, Any]:
        return {"files": {}}

    def barrier_position(self, previous: Any) -> dict[str, Any]:
        files = dict((previous or self.initial_position())["files"])
        for name, size in self.list_files().items():
            files.setdefault(name, size)
        return {"files": dict(sorted(files.items()))}

    @staticmethod
    def split(previous: Any, barrier: Any) -> dict[str, int]:
        """The files in ``[previous, barrier)``: in the barrier, not yet processed."""
        done = (previous or {"files": {}})["files"]
        return {n: s for n, s in barrier["files"].items() if n not in done}

    # -- reading (Spark) ---------------------------------------------------------------
    def url(self, relative: str) -> str:
        fs, root = self._fs()
        protocol = fs.protocol[0] if isinstance(fs.protocol, tuple) else fs.protocol
        protocol = "file" if protocol in ("file", "local") else protocol
        return f"{protocol}://{root}/{relative}"

    def read(self, ctx: StepContext, previous: Any, barrier: Any) -> DataFrame:
        from pyspark.sql import functions as F

        todo = self.split(previous, barrier)
        self._check_unchanged(todo)
        ctx.add_metric("files_in", len(todo))
        if not todo:
            return ctx.spark.createDataFrame([], self.schema).cache()
        reader = ctx.spark.read.format(self.format).options(**self.options)
        if self.format == "csv":
            reader = reader.option("header", self.options.get("header", "true"))
        if self.format in ("json", "csv"):
            from pyspark.sql.types import StringType, StructField, StructType

            declared = StructType.fromDDL(self.schema)
            assert isinstance(declared, StructType)
            schema = StructType([*declared.fields, StructField(_CORRUPT, StringType(), True)])
            reader = reader.schema(schema).option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", _CORRUPT)
        else:
            reader = reader.schema(self.schema)
        df = reader.load([self.url(n) for n in sorted(todo)])
        if self.format in ("json", "csv"):
            df = df.withColumn("_source_file", F.col("_metadata.file_path")).cache()
            bad = df.where(F.col(_CORRUPT).isNotNull()).select("_source_file", _CORRUPT).limit(5).collect()
            if bad:
                df.unpersist()
                raise MalformedInputError(self._describe_malformed([(r[0], r[1]) for r in bad]))
            return df.drop(_CORRUPT, "_source_file")  # served from the cache above
        return df.cache()

    def _check_unchanged(self, todo: dict[str, int]) -> None:
        if not todo:
            return
        now = self.list_files()
        for name, size in todo.items():
            if name not in now:
                raise InputChangedError(
                    f"source {self.uid}: {self.url(name)} was cut into this checkpoint's barrier but "
                    "has been removed; this checkpoint is aborted and the next one cuts a new barrier"
                )
            if now[name] != size:
                raise InputChangedError(
                    f"source {self.uid}: {self.url(name)} changed size after the barrier "
                    f"({size} → {now[name]} bytes); land files under a hidden name (.x or _x) and "
                    "rename them when complete"
                )

    def _describe_malformed(self, bad: list[tuple[str, str]]) -> str:
        fs, _ = self._fs()
        lines = []
        for file_url, record in bad:
            line_no = "?"
            with fs.open(fs._strip_protocol(file_url), "rt", errors="replace") as f:
                for i, line in enumerate(f, start=1):
                    if line.rstrip("\r\n") == record.rstrip("\r\n"):
                        line_no = str(i)
                        break
            lines.append(f"  {file_url} line {line_no}: {record[:200]!r}")
        return (
            f"source {self.uid}: malformed {self.format} record(s) not matching schema "
            f"<{self.schema}>:\n" + "\n".join(lines) + "\nFix or remove the file; nothing of this "
            "checkpoint was committed and the next run will read it again."
        )
