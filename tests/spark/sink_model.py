"""The plain-Python model of the documented sink semantics, and one harness per sink that drives
a real sink as the coordinator does and reads its table back with independent readers.

The model (DESIGN.md §5b, docs/*.md), for rows ``(k1, k2, seq, v)`` keyed by ``(k1, k2)``:

- append: every input row of a committed checkpoint once (duplicates kept), nothing of an
  aborted or abandoned one;
- upsert: one row per key (``None`` is a value, ``None`` and ``''`` differ). Within a checkpoint
  the row with the greatest ``sequence_by`` wins, ties and no ``sequence_by`` to the later row
  in input order; exact duplicates collapse; a later checkpoint's row replaces an earlier one;
  with deletes (``delete_when``), a winning row whose value is :data:`DELETE` removes its key,
  whatever the earlier checkpoints wrote; with soft deletes (``deletes="soft"``) it stays, with the
  ``soft_column`` true (false in every other row), until a later row of its key replaces it;
- a commit retried is a no-op; a second attempt replaces the first attempt's staging;
- restore to c (``rollback(c)`` then the recommit of c): Delta and PostgreSQL return the table
  (and PostgreSQL's dead letters) to what c committed; a Parquet append table withdraws the
  files of the checkpoints after c; a Parquet upsert table is left as it is;
- PostgreSQL with a dead-letter table: a row holding a NUL byte is refused, recorded once as a
  dead letter of its checkpoint, and (upsert) leaves its key as it was.
"""

from __future__ import annotations

import json
import pathlib
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

Row = tuple[str | None, int | None, int, str | None]
Key = tuple[str | None, int | None]
SCHEMA = "k1 string, k2 long, seq long, v string"
COLUMNS = ["k1", "k2", "seq", "v"]
KEYS = ["k1", "k2"]
T = TypeVar("T")
POISON = "nul\x00byte"
"""A value PostgreSQL refuses (a NUL byte in text): a dead letter for the PostgreSQL sink."""
DELETE = "⌦delete"
"""The value of a row that deletes its key (``deleted`` true in the sink's input) when the sink applies deletes."""


def key_of(row: Row) -> Key:
    return (row[0], row[1])


def sort_rows(rows: Iterable[T]) -> list[T]:
    return sorted(rows, key=repr)


@dataclass(frozen=True)
class Config:
    """One sink under test: kind (``parquet``, ``delta``, ``postgres``), mode and options."""

    kind: str
    mode: str
    sequence_by: bool = False
    driver_merge_rows: int = 4
    buckets: int = 2
    null_keys: bool = True  # soak.py --no-null-keys: look past a failure on null key parts
    faults: tuple[str, ...] = ()  # soak.py --skip-fault: faults left out
    one_row_per_key: bool = False  # soak.py --one-row-per-key: look past a failure on several rows of a key
    partition_per_checkpoint: bool = False  # postgres append: commits attach a partition per checkpoint
    deletes: bool = False  # upsert: rows valued DELETE delete their key (delete_when="deleted")
    inline_dvs: bool = False  # delta upsert: inline_deletion_vectors=True
    soft_column: str | None = None  # with deletes: deletes="soft", deleted_column=soft_column
    driver: bool = False  # postgres: the input as a source that read it on the driver hands it (no Spark job)
    collected: bool = False  # postgres: a DataFrame whose row count the step knows, collected into the driver

    @property
    def name(self) -> str:
        return (
            f"{self.kind}-{self.mode}"
            + ("-seq" if self.sequence_by else "")
            + ("-partitions" if self.partition_per_checkpoint else "")
            + ("-deletes" if self.deletes else "")
            + ("-inline-dvs" if self.inline_dvs else "")
            + (f"-soft{self.soft_column}" if self.soft_column else "")
            + ("-driver" if self.driver else "")
            + ("-collected" if self.collected else "")
        )

    @property
    def dead_letters(self) -> bool:
        return self.kind == "postgres"


@dataclass
class Model:
    """What each table must hold, after every checkpoint, restore and fault."""

    config: Config
    rows: list[Row] = field(default_factory=list)  # append: a multiset (as a list)
    latest: dict[Key, Row] = field(default_factory=dict)  # upsert
    dead: list[tuple[int, Row]] = field(default_factory=list)  # (checkpoint id, refused row)
    timeline: list[int] = field(default_factory=list)  # committed checkpoints of the current timeline
    history: dict[int, tuple[list[Row], dict[Key, Row], list[tuple[int, Row]]]] = field(default_factory=dict)

    def refused(self, row: Row) -> bool:
        return self.config.dead_letters and row[3] is not None and "\x00" in row[3]

    def resolve(self, batch: Sequence[Row]) -> dict[Key, Row]:
        """One row per key of one checkpoint's input: greatest ``seq`` (ties: later), else the later row."""
        won: dict[Key, Row] = {}
        for row in batch:
            k = key_of(row)
            if k not in won or not self.config.sequence_by or row[2] >= won[k][2]:
                won[k] = row
        return won

    def commit(self, checkpoint_id: int, batch: Sequence[Row]) -> None:
        good = [r for r in batch if not self.refused(r)]
        self.dead += [(checkpoint_id, r) for r in batch if self.refused(r)]
        if self.config.mode == "append":
            self.rows += good
        else:
            for k, row in self.resolve(good).items():
                if self.config.soft_column:
                    self.latest[k] = (*row, row[3] == DELETE)
                elif row[3] == DELETE:
                    self.latest.pop(k, None)
                else:
                    self.latest[k] = row
        self.timeline.append(checkpoint_id)
        self.history[checkpoint_id] = (list(self.rows), dict(self.latest), list(self.dead))

    def restorable(self) -> list[int]:
        """Restore targets: the newest three checkpoints of the current timeline (PostgreSQL keeps the
        before-images of ``undo_checkpoints=3`` commits)."""
        return self.timeline[-3:]

    def restore(self, checkpoint_id: int) -> None:
        self.timeline = self.timeline[: self.timeline.index(checkpoint_id) + 1]
        if self.config.kind == "parquet" and self.config.mode == "upsert":
            return  # left as it is: replaying the input converges it (docs/savepoints-and-restore.md)
        rows, latest, dead = self.history[checkpoint_id]
        self.rows, self.latest, self.dead = list(rows), dict(latest), list(dead)

    def expected(self) -> list[Row]:
        return sort_rows(self.rows if self.config.mode == "append" else self.latest.values())

    def expected_dead(self) -> list[tuple[int, Row]]:
        return sorted(self.dead, key=repr)


def _normal(record: Any) -> Row:
    return (record["k1"], record["k2"], record["seq"], record["v"])


class Harness:
    """One fresh target of a sink, staged, committed, aborted and rolled back as the coordinator does."""

    def __init__(
        self, config: Config, spark: Any, root: pathlib.Path, name: str, server: Any = None, delta_spark: Any = None
    ) -> None:
        from airflow_provider_checkpoint.dataflow.graph import Source
        from airflow_provider_checkpoint.storage import JobStorage

        self.config, self.spark, self.server, self.delta_spark = config, spark, server, delta_spark
        self.storage = JobStorage.for_job(str(root / "jobs"), f"job-{name}")
        self.path = root / name
        upsert = config.mode == "upsert"
        options: dict[str, Any] = {"keys": KEYS if upsert else None}
        if config.sequence_by:
            options["sequence_by"] = ["seq"]
        if config.partition_per_checkpoint:
            options["partition_per_checkpoint"] = True
        if config.deletes:
            options["delete_when"] = "deleted"
        if config.soft_column:
            options.update(deletes="soft", deleted_column=config.soft_column)
        if config.kind != "postgres" and upsert:
            options.update(buckets=config.buckets, driver_merge_rows=config.driver_merge_rows)
        if config.kind == "parquet":
            from airflow_provider_checkpoint.connectors.files.parquet_sink import ParquetTableSink

            self.sink: Any = ParquetTableSink("out", Source("src"), str(self.path), config.mode, **options)
        elif config.kind == "delta":
            from airflow_provider_checkpoint.connectors.delta.sink import DeltaTableSink

            inline = {"inline_deletion_vectors": True} if config.inline_dvs else {}
            self.sink = DeltaTableSink("out", Source("src"), str(self.path), config.mode, **options, **inline)
        else:
            from airflow_provider_checkpoint.connectors.postgres.sink import PostgresTableSink

            self.schema = name.replace("-", "_")
            with server.connect() as db:
                db.execute(f"CREATE SCHEMA {self.schema}")
            self.sink = PostgresTableSink(
                "out", Source("src"), "pg_model", f"{self.schema}.facts", config.mode, **options,
                dead_letter_table="dead", max_refused_fraction=1.0, undo_checkpoints=3,
            )  # fmt: skip

    # -- driving -------------------------------------------------------------------------
    def stage(self, checkpoint_id: int, attempt: int, batch: Sequence[Row]) -> Any:
        from tests.spark.helpers import step_context

        ctx = step_context(self.spark, self.storage, checkpoint_id, attempt)
        self.sink.prepare(ctx)
        if not self.config.deletes:
            df = self.spark.createDataFrame(list(batch), SCHEMA)
        else:
            df = self.spark.createDataFrame([(*r, r[3] == DELETE) for r in batch], f"{SCHEMA}, deleted boolean")
        if self.config.driver:
            from airflow_provider_checkpoint.dataflow.driver_rows import SourceRows

            return self.sink.stage(ctx, SourceRows(df.toArrow(), df.schema, lambda: df))
        if self.config.collected:  # as a stateful operator's output: its count known, Spark's estimate of its size
            df = df.cache()
            ctx.output_rows["src"] = df.count()
        return self.sink.stage(ctx, df)

    def commit(self, checkpoint_id: int, committables: Any) -> None:
        self.sink.commit(checkpoint_id, committables)

    def abort(self, checkpoint_id: int) -> None:
        self.sink.abort(checkpoint_id)

    def rollback(self, checkpoint_id: int) -> None:
        self.sink.rollback(checkpoint_id)

    def crash_server(self) -> None:
        self.server.kill()
        self.server.start()

    # -- independent readers ---------------------------------------------------------------
    def readers(self) -> dict[str, Callable[[], list[Row]]]:
        columns = COLUMNS + ([self.config.soft_column] if self.config.soft_column else [])
        if self.config.kind == "parquet":
            return {"pyarrow": lambda: parquet_rows(self.path, columns)}
        if self.config.kind == "delta":
            readers = {
                "delta-rs scan()": lambda: delta_rows(self.path, columns),
                "duckdb delta_scan": lambda: duckdb_delta_rows(self.path, columns),
            }
            if self.delta_spark is not None:
                from tests.spark.delta_spark import delta_spark_rows

                readers["delta-spark"] = lambda: delta_spark_rows(self.delta_spark, self.path, columns)
            return readers
        return {"psycopg": lambda: self._psycopg(columns)}

    def _psycopg(self, columns: Sequence[str]) -> list[Row]:
        select = ", ".join(f'"{c}"' for c in columns)
        with self.server.connect() as db:
            exists = db.execute("SELECT to_regclass(%s)", [f"{self.schema}.facts"]).fetchone()[0]
            return [] if exists is None else sort_rows(db.execute(f"SELECT {select} FROM {self.schema}.facts"))

    def dead_letters(self) -> list[tuple[int, Row]]:
        """PostgreSQL's dead-letter table: (checkpoint id, the refused row) of each entry."""
        if not self.config.dead_letters:
            return []
        with self.server.connect() as db:
            if db.execute("SELECT to_regclass(%s)", [f"{self.schema}.dead"]).fetchone()[0] is None:
                return []
            found = db.execute(f"SELECT checkpoint_id, record FROM {self.schema}.dead").fetchall()
        return sorted(((c, _normal(json.loads(r))) for c, r in found), key=repr)


def parquet_rows(path: pathlib.Path, columns: Sequence[str]) -> list[Any]:
    """The ``columns`` of every row of the Parquet table at ``path`` (none if it does not exist), read
    with pyarrow (files and directories named ``_*`` or ``.*`` are skipped), sorted."""
    import pyarrow.dataset as ds

    if not path.exists():
        return []
    table = ds.dataset(str(path), format="parquet").to_table()
    return sort_rows(_tuples(table, columns)) if table.num_rows else []  # no file yet: no columns either


def _has_delta(path: pathlib.Path) -> bool:
    return (path / "_delta_log").exists() and any((path / "_delta_log").glob("*.json"))


def delta_rows(path: pathlib.Path, columns: Sequence[str]) -> list[Any]:
    """The ``columns`` of every live row of the Delta table at ``path`` (none if it has no log), read
    with delta-rs ``scan()`` (deletion vectors applied), sorted."""
    import pyarrow as pa
    from deltalake import DeltaTable

    if not _has_delta(path):
        return []
    return sort_rows(_tuples(pa.table(DeltaTable(str(path)).scan()), columns))


def duckdb_delta_rows(path: pathlib.Path, columns: Sequence[str]) -> list[Any]:
    """The ``columns`` of every live row of the Delta table at ``path``, read with DuckDB's
    ``delta_scan`` (the extension loaded from PyPI's ``duckdb-extension-delta``), sorted."""
    import duckdb
    import duckdb_extension_delta

    if not _has_delta(path):
        return []
    ext = pathlib.Path(duckdb_extension_delta.__file__).parent / "extensions" / f"v{duckdb.__version__}"
    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    con.load_extension(str(ext / "delta.duckdb_extension"))
    select = ", ".join(f'"{c}"' for c in columns)
    return sort_rows(tuple(r) for r in con.sql(f"SELECT {select} FROM delta_scan('{path}')").fetchall())


def _tuples(table: Any, columns: Sequence[str]) -> Iterable[tuple[Any, ...]]:
    """The ``columns`` of a pyarrow ``table``, row by row."""
    return zip(*(table[c].to_pylist() for c in columns), strict=True)


def scratch_root() -> pathlib.Path:
    return pathlib.Path(tempfile.mkdtemp(prefix="sink-model-"))
