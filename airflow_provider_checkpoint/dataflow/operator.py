"""Stateful operators: keyed state carried across checkpoints, and the changelog columns of their
incremental form. Nodes import no Spark at DAG-parse time."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.core.event_time import WatermarkProgress, WatermarkSpec
from airflow_provider_checkpoint.core.model import Barrier, JsonDict
from airflow_provider_checkpoint.dataflow.graph import Node
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession

DELETED = "__deleted"
"""Changelog column: the key's state is removed."""
NEW = "__new"
"""Changelog column: the key had no state before."""
CHANGED = "__changed"
"""Optional changelog column: the key's state changed (a changelog with it lists every key)."""
Ranges = Callable[["pa.Table"], "pa.Array"]
"""The key-group range index of each row of a table, by its key columns (as the state files it)."""


class StatefulOperator(Node):
    """Keyed state carried across checkpoints, over one input or several.

    ``process(inputs, state, barrier) -> (new_state, output)``: ``inputs`` maps the uid of
    every input to exactly its records of this checkpoint — each read up to the same
    barrier (aligned) — ``state`` is the full keyed state of the restore point (empty on
    the first run), ``new_state`` the full state after this checkpoint, ``output`` what
    flows downstream. Single-input operators implement ``apply(input, state)`` instead.
    Given the same restore point and barrier, the result must be the same (retries).
    """

    kind = "stateful"
    moves_keys = False
    """Whether :meth:`merge_at_arrow` writes keys no input row names and deletes keys the watermark does
    not close (a session's row moves to its merged bounds): it needs every range's state, and files
    its new keys by ``ranges``."""

    def __init__(self, uid: str, input: Node | Sequence[Node], keys: Sequence[str], max_parallelism: int = 128) -> None:
        super().__init__(uid, [input] if isinstance(input, Node) else list(input))
        if not keys:
            raise PipelineDefinitionError(f"{uid}: keyed state needs at least one key column")
        if not 1 <= max_parallelism <= 32768:
            raise PipelineDefinitionError(f"{uid}: max_parallelism must be in [1, 32768]")
        if len({n.uid for n in self.inputs}) != len(self.inputs):
            raise PipelineDefinitionError(f"{uid}: the same input is given twice")
        self.keys = tuple(keys)
        self.max_parallelism = max_parallelism

    def describe(self) -> JsonDict:
        declared = self.state_declaration()
        return {
            **super().describe(),
            "keys": list(self.keys),
            "max_parallelism": self.max_parallelism,
            **({"state": declared} if declared else {}),
        }

    def state_declaration(self) -> dict[str, str]:
        """What the stored state means beyond its keys: the settings that, changed, would have the state
        read wrongly (a window's size, an aggregate, the clock of a TTL), each as a short text. Each
        snapshot records it, and a checkpoint continuing or restoring a snapshot whose declaration
        differs is refused before any effect (:func:`~.restore.snapshot.check_compatible`)."""
        return {}

    def upstream_watermark(self) -> WatermarkSpec | None:
        """``None``: a stateful operator ends the watermark of the records it reads."""
        return None

    def own_watermark(self, given: tuple[str, str] | None, needed_by: str | None) -> WatermarkSpec | None:
        """``watermark=`` as given, else the one declared upstream of the (first) input
        (:meth:`Node.upstream_watermark`); none and ``needed_by`` (what needs it): refused."""
        spec = WatermarkSpec.of(given, self.uid) if given is not None else self.inputs[0].upstream_watermark()
        if spec is None and needed_by is not None:
            raise PipelineDefinitionError(
                f"{self.uid}: {needed_by} needs a watermark and input {self.inputs[0].uid} has none: give watermark="
                "(time_column, bound) here, e.g. ('ts', '10 minutes'), or watermark= on the source(s) it reads"
            )
        return spec

    def process_metrics(self) -> dict[str, int]:
        """Figures of this instance's last :meth:`process` or :meth:`process_at` (e.g. timers fired),
        which the checkpoint adds to its metrics; taking them clears them. None by default."""
        return {}

    def initial_state(self, spark: SparkSession, inputs: Mapping[str, DataFrame]) -> DataFrame:
        raise NotImplementedError

    def process(
        self, inputs: Mapping[str, DataFrame], state: DataFrame, barrier: Barrier
    ) -> tuple[DataFrame, DataFrame]:
        return self.apply(inputs[self.inputs[0].uid], state)

    def apply(self, input: DataFrame, state: DataFrame) -> tuple[DataFrame, DataFrame]:
        raise NotImplementedError

    one_row_per_key = True
    """The state holds at most one row per key: a checkpoint may then write only the keys whose
    row changed (incremental state). ``False``: every checkpoint writes a full version."""

    reads_union_inputs = False
    """The ``inputs`` of :meth:`event_time` and :meth:`process_at` also hold the records of each input
    of a :class:`Union` input, by uid (an event-time operator keeps a watermark per input of a union)."""

    reads_input_once = False
    """The operator's first Spark action reads its whole input, and it never reads the input
    again: a source feeding only this operator is then read in one pass, uncached
    (:meth:`Source.read_once`)."""

    def changes(
        self, inputs: Mapping[str, DataFrame], state: DataFrame, barrier: Barrier, state_rows: int
    ) -> DataFrame | None:
        """The changelog form of :meth:`process`, used by incremental checkpoints when given.

        ``state_rows``: the number of rows in ``state`` (to choose a plan by size).

        One row per key whose state changes: the state columns with the new values, plus
        boolean ``__deleted`` (the key's state is removed) and ``__new`` (the key had no
        state). The operator's output is then the new rows of the changed keys. ``None``
        (the default): the checkpoint compares :meth:`process`'s new state with the old.
        A changelog may also hold every unchanged key, with boolean ``__changed`` marking
        the changed ones: when most keys changed, the checkpoint can then write the new
        state as a full version instead of a delta.
        """
        return None

    def partials(self, inputs: Mapping[str, DataFrame]) -> DataFrame | None:
        """This checkpoint's input reduced to at most one row per key, which :meth:`merge_arrow`
        combines with the keys' state rows; ``None`` (the default): the operator has no such
        form, and its state is merged by Spark only."""
        return None

    def takes_source_rows(self) -> bool:
        """Whether :meth:`partials_arrow` may reduce input rows its source read on the driver
        (:meth:`~airflow_provider_checkpoint.dataflow.graph.Source.read_for_operator`); ``False`` here."""
        return False

    def partials_arrow(self, rows: pa.Table) -> pa.Table | None:
        """:meth:`partials` of the input ``rows`` the driver holds (read there by its source), in pyarrow,
        where that gives Spark's values; ``None`` (the default): Spark reduces the input."""
        return None

    def first_state(
        self, inputs: Mapping[str, DataFrame], range_column: Column, name: str, ranges: int
    ) -> DataFrame | None:
        """The state after a first checkpoint (no state before), clustered by key-group range in one
        shuffle: the state columns plus ``name`` = ``range_column`` (a range index below ``ranges``), in
        ``ranges`` partitions by it, so that each range's file is written where it is computed. The
        output of such a checkpoint must be these state rows: every key changed, none deleted.
        ``None`` (the default): the operator has no such form."""
        return None

    def event_time(
        self, inputs: Mapping[str, DataFrame], before: WatermarkProgress, barrier: Barrier
    ) -> tuple[WatermarkProgress, dict[str, int]] | None:
        """The watermark this checkpoint (``barrier``) reaches from ``before`` (its restore point's) and
        metrics about its input's event time (late rows), for an operator with an event-time input; ``None``
        (the default): the operator has none. When given, the snapshot records the watermark and
        :meth:`process_at` runs instead of :meth:`process` (and of :meth:`changes`, :meth:`partials`
        and :meth:`first_state`)."""
        return None

    def process_at(
        self,
        inputs: Mapping[str, DataFrame],
        state: DataFrame,
        barrier: Barrier,
        before: WatermarkProgress,
        after: WatermarkProgress,
    ) -> tuple[DataFrame, DataFrame]:
        """:meth:`process` of an operator with event time: rows are judged against the watermark
        ``before`` this checkpoint, and what the watermark ``after`` it closes is emitted by it."""
        raise NotImplementedError

    def changes_at(
        self,
        inputs: Mapping[str, DataFrame],
        state: DataFrame,
        barrier: Barrier,
        before: WatermarkProgress,
        after: WatermarkProgress,
    ) -> tuple[DataFrame, DataFrame] | None:
        """The changelog form of :meth:`process_at` (as :meth:`changes` describes it) and the output:
        used by incremental checkpoints of an operator with event time when given. ``None`` (the
        default): the checkpoint compares :meth:`process_at`'s new state with the old."""
        return None

    def partials_at(self, inputs: Mapping[str, DataFrame], before: WatermarkProgress) -> DataFrame | None:
        """:meth:`partials` of an operator with event time (rows late by the watermark ``before`` this
        checkpoint left out), which :meth:`merge_at_arrow` merges; ``None`` (the default): none."""
        return None

    def merge_at_arrow(
        self, state: pa.Table, partials: pa.Table, after: WatermarkProgress, ranges: Ranges
    ) -> tuple[pa.Table, pa.Table]:
        """:meth:`merge_arrow` of an operator with event time, given the ``state`` rows of at least the keys
        in ``partials`` and of every key the watermark ``after`` this checkpoint may close
        (:meth:`closes_below`; every row with :attr:`moves_keys`): the changed rows (the state columns,
        boolean ``__deleted`` and ``__new``, every other column of ``partials`` or ``state`` as it was, the
        range of a key no input row names by ``ranges``; a deleted row had state) and the output rows (the
        state columns)."""
        raise NotImplementedError

    def closes_below(self, after: WatermarkProgress) -> tuple[str, int | None]:
        """A timestamp state column and the time (µs) below which the watermark ``after`` may delete a key
        of it without input (:meth:`merge_at_arrow`); ``None``: it deletes none."""
        raise NotImplementedError

    def output_of(self, state: DataFrame) -> DataFrame:
        """The output of a checkpoint whose changed keys have the new ``state`` rows (from
        :meth:`changes`, :meth:`first_state` or :meth:`merge_arrow`): those rows themselves here."""
        return state

    def output_arrow(self, state: pa.Table) -> pa.Table | None:
        """:meth:`output_of` in pyarrow; ``None``: Spark alone computes it."""
        return state

    def merge_arrow(self, state: pa.Table, partials: pa.Table) -> pa.Table:
        """The new state rows of the keys in ``partials`` (rows of :meth:`partials`), given the
        ``state`` rows of at least those keys: the state columns, boolean ``__new`` (the key had
        no state row), and every other column of ``partials`` as it was."""
        raise NotImplementedError
