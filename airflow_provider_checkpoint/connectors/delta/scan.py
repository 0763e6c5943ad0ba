"""Reading a Delta table's data files with Spark: the rows of the files a version or a range of versions
names, with the partition values the log gives, the rows deletion vectors delete left out, and, with the
change data feed, each row's change type and commit version; in source order when asked."""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.connectors.delta import deletion_vectors
from airflow_provider_checkpoint.connectors.delta import storage as delta_storage
from airflow_provider_checkpoint.connectors.delta.log import DataFile
from airflow_provider_checkpoint.fileio.frames import arrow_frame
from airflow_provider_checkpoint.fileio.scans import ORDERED_SCAN_FILES, FileColumn, read_parquet
from airflow_provider_checkpoint.fileio.writes import engine_for

if TYPE_CHECKING:
    import fsspec
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"


def output_schema(schema: StructType, change_data_feed: bool) -> StructType:
    """The columns a table of ``schema`` is read with: its own, plus the change columns with the feed."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    if not change_data_feed:
        return schema
    extra = [StructField(CHANGE_TYPE, StringType(), False), StructField(COMMIT_VERSION, LongType(), False)]
    return StructType([*schema.fields, *extra])


@dataclass(frozen=True)
class TableScan:
    """The data files of the Delta table ``path`` (its files under ``root`` on ``fs``), read with the change
    columns if ``change_data_feed``, and in source order if ``in_source_order``."""

    fs: fsspec.AbstractFileSystem
    root: str
    path: str
    change_data_feed: bool = False
    in_source_order: bool = False

    def load(
        self, spark: SparkSession, schema: StructType, partition_columns: Sequence[str], files: Sequence[DataFile]
    ) -> DataFrame:
        """``files`` read by Spark in one scan (one per group of files with distinct base names).

        With :attr:`in_source_order` the partitions hold the rows in source order:
        commits in version order, each file's rows in order (as
        :func:`~airflow_provider_checkpoint.fileio.scans.in_file_order` does: up to
        :data:`~airflow_provider_checkpoint.fileio.scans.ORDERED_SCAN_FILES` files one scan each, else one sort)."""
        if not files:
            return spark.createDataFrame([], output_schema(schema, self.change_data_feed))
        ordered = self.in_source_order and len(files) > 1
        if ordered and len(files) <= ORDERED_SCAN_FILES:
            scans = [self.scan(spark, schema, partition_columns, {posixpath.basename(f.path): f}) for f in files]
            return reduce(lambda a, b: a.unionAll(b), scans)
        rounds: list[dict[str, DataFile]] = []
        for f in files:
            name = posixpath.basename(f.path)
            free = next((r for r in rounds if name not in r), None)
            if free is None:
                rounds.append(free := {})
            free[name] = f
        rank = None
        if ordered and (len(rounds) > 1 or engine_for(spark, self.fs) == "hadoop"):
            rank = {id(f): i for i, f in enumerate(files)}
        df = reduce(lambda a, b: a.unionAll(b), [self.scan(spark, schema, partition_columns, r, rank) for r in rounds])
        return df if rank is None else df.orderBy(_RANK, _POSITION).drop(_RANK, _POSITION)

    def scan(
        self,
        spark: SparkSession,
        schema: StructType,
        partition_columns: Sequence[str],
        files: dict[str, DataFile],
        rank: dict[int, int] | None = None,
    ) -> DataFrame:
        """One Parquet scan of ``files`` (keyed by base name); what the log says per file (partition
        values, change type, commit version) is looked up by the row's file name. ``rank``: each
        file's place in source order (by ``id``), kept with each row's position in the scan."""
        from pyspark.sql import Column
        from pyspark.sql import functions as F
        from pyspark.sql.types import StringType, StructField, StructType

        def per_file(value: Callable[[DataFile], Any]) -> Column:
            pairs = [F.lit(x) for name, f in files.items() for x in (name, value(f))]
            return F.element_at(F.create_map(*pairs), F.col(_FILE))

        def partition_value(column: str) -> Callable[[DataFile], str | None]:
            return lambda f: dict(f.partition_values).get(column)

        feed = self.change_data_feed
        stored = [f for f in schema.fields if f.name not in partition_columns]
        read = StructType([*stored, *([StructField(CHANGE_TYPE, StringType())] if feed else [])])
        delta_storage.check_table(self.fs, self.root, self.path, files.values())
        paths = [f"{self.root}/{f.path}" for f in files.values()]
        deleted, picked = _rows(self.fs, self.root, files)
        df = read_parquet(
            spark,
            self.fs,
            paths,
            read,
            FileColumn(_FILE, "name"),
            row_index=None if deleted is None and picked is None else _ROW,
        )
        if rank is not None:
            df = df.withColumn(_POSITION, F.monotonically_increasing_id())
        if deleted is not None:  # rows a deletion vector deletes are not the file's rows
            df = df.join(arrow_frame(spark, deleted), [_FILE, _ROW], "left_anti")
        if picked is not None:  # a file whose DV a commit changed: only the rows whose bit changed
            df = df.join(arrow_frame(spark, picked), [_FILE, _ROW], "left")
            df = df.filter(F.col(_PICKED).isNotNull() | ~per_file(lambda f: f.rows_of is not None)).drop(_PICKED)
        columns = [
            per_file(partition_value(c.name)).cast(c.dataType).alias(c.name)
            if c.name in partition_columns
            else F.col(c.name)
            for c in schema.fields
        ]
        if feed:  # a cdc file holds its change type, a whole data file is an insert or a delete
            columns += [
                F.coalesce(F.col(CHANGE_TYPE), per_file(lambda f: f.change_type)).alias(CHANGE_TYPE),
                per_file(lambda f: f.commit_version).cast("long").alias(COMMIT_VERSION),
            ]
        if rank is not None:
            columns += [per_file(lambda f: rank[id(f)]).alias(_RANK), F.col(_POSITION)]
        return df.select(*columns)


_FILE, _ROW, _RANK, _POSITION, _PICKED = "__delta_file", "__delta_row", "__delta_rank", "__delta_position", "__picked"


def _rows(fs: fsspec.AbstractFileSystem, root: str, files: dict[str, DataFile]) -> tuple[Any, Any]:
    """``(file name, row index)`` of every row the deletion vectors of the files delete, and of every row a
    file with :attr:`~.log.DataFile.rows_of` is read for (those it marks less those its DV deletes), as Arrow
    tables; ``None`` for none."""
    import numpy as np
    import pyarrow as pa

    def positions(dv: Any, f: DataFile) -> Any:
        return deletion_vectors.read_positions(fs, root, dv, f"deletion vector of {f.path}").astype(np.int64)

    found: dict[bool, tuple[list[Any], list[Any]]] = {False: ([], []), True: ([], [])}
    for name, f in files.items():
        if f.rows_of is not None:
            rows = positions(f.rows_of, f)
            if f.deletion_vector is not None:
                rows = np.setdiff1d(rows, positions(f.deletion_vector, f))
        elif f.deletion_vector is not None:
            rows = positions(f.deletion_vector, f)
        else:
            continue
        names, indexes = found[f.rows_of is not None]
        names.append(np.full(len(rows), name, dtype=object))
        indexes.append(rows)

    def table(picked: bool) -> Any:
        names, indexes = found[picked]
        if not names:
            return None
        columns = {_FILE: pa.array(np.concatenate(names), pa.string()), _ROW: np.concatenate(indexes)}
        return pa.table({**columns, **({_PICKED: np.ones(sum(map(len, indexes)), bool)} if picked else {})})

    return table(False), table(True)
