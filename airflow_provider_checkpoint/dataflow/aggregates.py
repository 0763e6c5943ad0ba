"""The mergeable aggregates of a keyed aggregate: each one's spec, state columns, Spark and Arrow combines.

An aggregate keeps per key a few *state columns*, from which its output column is computed. Its
state is mergeable: the state of the union of two inputs is a function of their two states, so a
checkpoint merges the state of its input with the restored state, and any split of the input
(Spark partitions, checkpoints, rescaled key-group ranges, the driver's pyarrow merge) gives the
same state. A state column named like the output column is visible in the output; the others are
*hidden* (named ``__<output>__<part>``, never in the output). Spark is imported where a step runs.

- ``count``, ``count(col)``, ``sum(col)``, ``min(col)``, ``max(col)``: the state is the output.
- ``avg(col)``: hidden ``sum`` and ``count`` (of non-null values); the output is ``sum / count``.
- ``min_by(col, ord)`` / ``max_by(col, ord)``: ``col`` at the smallest/largest ``ord`` (rows with
  a null ``ord`` ignored); ties on ``ord`` go to the smallest/largest ``col`` (null lowest).
- ``first(col, by)`` / ``last(col, by)``: the same over the rows where ``col`` is not null.
- ``collect_set(col, n)``: the ``n`` smallest distinct non-null values, sorted ascending.
- ``approx_count_distinct(col)``: a hidden HyperLogLog sketch (Apache DataSketches HLL_8,
  ``lg_k`` :data:`HLL_LG_K`), merged by union; the output is its estimate (see :data:`HLL_LG_K`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column
    from pyspark.sql.types import DataType

HLL_LG_K = 12
"""log2 of the HyperLogLog sketch's registers (4,096; Spark's default): a relative standard error of
1.63%, so an estimate is within 3.3% of the exact distinct count 95% of the time and within 4.9%
99.7% of the time; exact up to a few hundred values (the sketch then keeps every hash)."""

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_SPEC = re.compile(rf"^\s*({_NAME})\s*(?:\((.*)\))?\s*$")
_COLUMN = re.compile(rf"^{_NAME}$")
SIMPLE = ("count", "sum", "min", "max")
ORDERED = ("min_by", "max_by", "first", "last")
FORMS = (
    "count",
    "count(col)",
    "sum(col)",
    "min(col)",
    "max(col)",
    "avg(col)",
    "approx_count_distinct(col)",
    "first(col, by)",
    "last(col, by)",
    "min_by(col, ord)",
    "max_by(col, ord)",
    "collect_set(col, max_size)",
)


@dataclass(frozen=True)
class Aggregate:
    """One aggregate: output column ``out`` = ``fn`` over ``column`` (``None``: ``count(*)``),
    ordered by ``by`` (the ordered forms) or bounded by ``size`` (``collect_set``)."""

    out: str
    fn: str
    column: str | None
    by: str | None = None
    size: int | None = None

    @classmethod
    def parse(cls, uid: str, out: str, spec: str) -> Aggregate:
        """The aggregate ``spec`` names, or :class:`PipelineDefinitionError` naming ``uid`` and the allowed forms."""
        m = _SPEC.match(spec) if isinstance(spec, str) else None
        args = [a.strip() for a in m.group(2).split(",")] if m and m.group(2) and m.group(2).strip() else []
        fn = m.group(1) if m else ""
        agg: Aggregate | None = None
        if fn == "count" and args in ([], ["*"]):
            agg = cls(out, fn, None)
        elif fn in (*SIMPLE, "avg", "approx_count_distinct") and len(args) == 1 and _COLUMN.match(args[0]):
            agg = cls(out, fn, args[0])
        elif fn in ORDERED and len(args) == 2 and all(_COLUMN.match(a) for a in args):
            agg = cls(out, fn, args[0], by=args[1])
        elif fn == "collect_set" and len(args) == 2 and _COLUMN.match(args[0]) and re.fullmatch(r"\d{1,6}", args[1]):
            agg = cls(out, fn, args[0], size=int(args[1])) if int(args[1]) >= 1 else None
        if agg is None:
            raise PipelineDefinitionError(
                f"{uid}: aggregate {out}={spec!r} is not one of {', '.join(FORMS)} "
                "(col, by, ord: input column names; max_size: a whole number from 1 to 999999)"
            )
        if out.startswith("__"):
            raise PipelineDefinitionError(f"{uid}: aggregate column {out!r} must not start with '__' (hidden state)")
        return agg

    def spec(self) -> str:
        """The canonical spec (as the job's topology records it)."""
        args = [self.column or "*", *([self.by] if self.by else []), *([str(self.size)] if self.size else [])]
        return f"{self.fn}({', '.join(args)})"

    def input_columns(self) -> tuple[str, ...]:
        return tuple(c for c in (self.column, self.by) if c is not None)

    def _hidden(self, part: str) -> str:
        return f"__{self.out}__{part}"

    def state_columns(self) -> tuple[str, ...]:
        """The state columns, in order."""
        if self.fn == "avg":
            return (self._hidden("sum"), self._hidden("count"))
        if self.fn == "approx_count_distinct":
            return (self._hidden("sketch"),)
        if self.fn in ORDERED:
            return (self.out, self._hidden("by"))
        return (self.out,)

    def raw_columns(self) -> tuple[str, ...]:
        """Hidden columns carrying an input row's value where it is not in state form (see :meth:`row`)."""
        return (self._hidden("raw"),) if self.fn in ("approx_count_distinct", "collect_set") else ()

    # -- Spark ---------------------------------------------------------------------------
    def partial(self) -> list[Column]:
        """Aggregate expressions of input rows giving the state columns (one per state column)."""
        from pyspark.sql import functions as F

        col = F.col(self.column) if self.column else F.lit(1)
        if self.fn == "count":
            return [F.count(col).alias(self.out)]
        if self.fn in ("sum", "min", "max"):
            return [getattr(F, self.fn)(col).alias(self.out)]
        if self.fn == "avg":
            return [F.sum(col).alias(self._hidden("sum")), F.count(col).alias(self._hidden("count"))]
        if self.fn == "approx_count_distinct":
            sketch = F.hll_sketch_agg(col, HLL_LG_K)  # stored as a union: see _canonical_sketch
            return [F.when(F.count(col) > 0, F.hll_union(sketch, sketch)).alias(self._hidden("sketch"))]
        if self.fn == "collect_set":
            return [self._bounded(F.collect_set(col)).alias(self.out)]
        best = F.min if self.fn in ("min_by", "first") else F.max
        pair = best(
            F.when(self._valid(col, F.col(self.by or "")), F.struct(F.col(self.by or "").alias("b"), col.alias("v")))
        )
        return [pair["v"].alias(self.out), pair["b"].alias(self._hidden("by"))]

    def _valid(self, value: Column, by: Column) -> Column:
        return by.isNotNull() & value.isNotNull() if self.fn in ("first", "last") else by.isNotNull()

    def _bounded(self, values: Column) -> Column:
        """The :attr:`size` smallest distinct ``values``, ascending; null when there are none."""
        from pyspark.sql import functions as F

        return F.when(F.size(values) > 0, F.slice(F.array_sort(F.array_distinct(values)), 1, self.size or 1))

    def row(self) -> list[Column]:
        """An input row's contribution: the state columns of the row alone where that is cheap (null
        for the others), and the raw columns (:meth:`raw_columns`)."""
        from pyspark.sql import functions as F

        col = F.col(self.column) if self.column else F.lit(1)
        if self.fn == "count":
            return [col.isNotNull().cast("long").alias(self.out)]
        if self.fn == "avg":
            return [col.alias(self._hidden("sum")), col.isNotNull().cast("long").alias(self._hidden("count"))]
        if self.fn in ORDERED:
            return [col.alias(self.out), F.col(self.by or "").alias(self._hidden("by"))]
        if self.fn in ("approx_count_distinct", "collect_set"):
            return [col.alias(self._hidden("raw"))]
        return [col.alias(self.out)]

    def no_raw(self, types: Mapping[str, DataType]) -> list[Column]:
        """The raw columns (:meth:`raw_columns`) of rows in state form: null, of the type :meth:`row` gives."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import ArrayType, StringType

        state = types[self.state_columns()[0]]
        kind = state.elementType if isinstance(state, ArrayType) else StringType()
        return [F.lit(None).cast(kind).alias(c) for c in self.raw_columns()]

    def combine(self, types: Mapping[str, DataType]) -> tuple[list[Column], list[Column]]:
        """How rows of state (and of :meth:`row`, or :meth:`partial` rows) of one key combine: aggregate
        expressions (named ``__agg_<out>_<i>``), then expressions over those giving the state columns
        cast to ``types``."""
        from pyspark.sql import functions as F

        names = [f"__agg_{self.out}_{i}" for i in range(3)]
        temp = [F.col(n) for n in names]
        state = [F.col(c) for c in self.state_columns()]
        if self.fn in ("count", "sum", "avg"):
            aggs = [F.sum(c) for c in state]
            final = temp[: len(state)]
        elif self.fn in ("min", "max"):
            aggs, final = [getattr(F, self.fn)(state[0])], temp[:1]
        elif self.fn == "approx_count_distinct":
            raw = F.col(self._hidden("raw"))
            aggs = [F.hll_sketch_agg(raw, HLL_LG_K), F.hll_union_agg(state[0]), F.count(raw)]
            final = [_canonical_sketch(F.when(temp[2] > 0, temp[0]), temp[1])]
        elif self.fn == "collect_set":
            aggs = [F.collect_set(F.col(self._hidden("raw"))), F.flatten(F.collect_list(state[0]))]
            final = [self._bounded(F.concat(F.coalesce(temp[0], F.array()), F.coalesce(temp[1], F.array())))]
        else:
            best = F.min if self.fn in ("min_by", "first") else F.max
            aggs = [best(F.when(self._valid(state[0], state[1]), F.struct(state[1].alias("b"), state[0].alias("v"))))]
            final = [temp[0]["v"], temp[0]["b"]]
        typed = [f.cast(types[c]).alias(c) for f, c in zip(final, self.state_columns(), strict=True)]
        return [a.alias(n) for a, n in zip(aggs, names, strict=False)], typed

    def merged(self, old: Mapping[str, Column], new: Mapping[str, Column]) -> list[Column]:
        """The state columns of a key from its ``old`` and ``new`` state rows (columns by state column name),
        either of which may be missing (all null)."""
        from pyspark.sql import functions as F

        cols = self.state_columns()
        if self.fn in ("count", "sum", "avg"):
            return [
                F.when(old[c].isNull(), new[c]).when(new[c].isNull(), old[c]).otherwise(old[c] + new[c]) for c in cols
            ]
        if self.fn in ("min", "max"):
            return [(F.least if self.fn == "min" else F.greatest)(old[cols[0]], new[cols[0]])]
        if self.fn == "approx_count_distinct":
            return [_canonical_sketch(old[cols[0]], new[cols[0]])]
        if self.fn == "collect_set":
            return [self._bounded(F.concat(F.coalesce(old[cols[0]], F.array()), F.coalesce(new[cols[0]], F.array())))]
        pick = F.least if self.fn in ("min_by", "first") else F.greatest  # least/greatest skip nulls
        pairs = [
            F.when(s[cols[1]].isNotNull(), F.struct(s[cols[1]].alias("b"), s[cols[0]].alias("v"))) for s in (old, new)
        ]
        best = pick(*pairs)
        return [best["v"], best["b"]]

    def output(self) -> Column:
        """The output column from the state columns."""
        from pyspark.sql import functions as F

        if self.fn == "avg":
            total, count = (F.col(c) for c in self.state_columns())
            return F.when(count > 0, F.try_divide(total, count)).alias(self.out)
        if self.fn == "approx_count_distinct":
            sketch = F.col(self._hidden("sketch"))
            return F.coalesce(F.hll_sketch_estimate(sketch), F.lit(0).cast("long")).alias(self.out)
        return F.col(self.out)

    # -- Arrow ---------------------------------------------------------------------------
    def arrow_mergeable(self) -> bool:
        """Whether :meth:`combine_arrow` merges this aggregate's state (else Spark merges it)."""
        return self.fn not in ("approx_count_distinct", "collect_set")

    def combine_arrow(self, rows: pa.Table, keys: list[str], starts: pa.Array) -> dict[str, pa.Array]:
        """The state columns per key from ``rows`` (state rows of several rows per key), as
        :meth:`combine` gives them: ``rows`` sorted by ``keys`` (:func:`key_order`), ``starts`` the
        index of each key's first row. Only for the ordered forms; :attr:`ARROW_COMBINE` names the others'."""
        import pyarrow as pa
        import pyarrow.compute as pc

        value, by = self.state_columns()
        valid = pc.is_valid(rows[by])
        if self.fn in ("first", "last"):
            valid = pc.and_(valid, pc.is_valid(rows[value]))
        order = "ascending" if self.fn in ("min_by", "first") else "descending"
        ranked = pa.table(
            {
                **{k: rows[k] for k in keys},
                "__invalid": pc.invert(valid),
                "__by": rows[by],
                "__has_value": pc.is_valid(rows[value]),  # null lowest: first among ties for min
                "__value": rows[value],
            }
        )
        sort = [*((k, "ascending", "at_start") for k in keys), ("__invalid", "ascending", "at_start")]
        sort += [("__by", order, "at_start"), ("__has_value", order, "at_start"), ("__value", order, "at_start")]
        best = rows.take(pc.take(pc.sort_indices(ranked, sort), starts))
        chosen = pc.is_valid(best[by])
        return {value: pc.if_else(chosen, best[value], None), by: best[by]}


DRIVER_PARTIALS = ("count", "min", "max")
"""The aggregates :func:`partials_arrow` computes."""


def partials_arrow(aggs: Mapping[str, Aggregate], keys: Sequence[str], rows: pa.Table) -> pa.Table | None:
    """The state columns per key of input ``rows`` (one row per key, a null key being a key), as
    :meth:`Aggregate.partial` gives them in Spark: the keys, then every aggregate's state columns. Only
    ``count``, ``count(col)``, ``min(col)`` and ``max(col)`` of strings, integers or booleans (pyarrow counts
    and orders those as Spark does); ``None`` for any other aggregate or type (Spark computes them)."""
    import pyarrow as pa

    def ordered(kind: pa.DataType) -> bool:
        return bool(pa.types.is_string(kind) or pa.types.is_integer(kind) or pa.types.is_boolean(kind))

    if not all(k in rows.column_names and ordered(rows.schema.field(k).type) for k in keys):
        return None
    specs: dict[str, tuple[str | list[str], str]] = {}  # by the column pyarrow names the aggregate
    names: dict[str, str] = {}
    for out, agg in aggs.items():
        if agg.fn == "count" and agg.column is None:
            names[out] = "count_all"
            specs["count_all"] = ([], "count_all")
        elif agg.fn in DRIVER_PARTIALS and agg.column is not None and agg.column in rows.column_names:
            if agg.fn != "count" and not ordered(rows.schema.field(agg.column).type):
                return None
            names[out] = f"{agg.column}_{agg.fn}"
            specs[names[out]] = (agg.column, agg.fn)
        else:
            return None
    if set(specs) & set(keys):
        return None  # a key named like pyarrow's result column
    grouped = rows.group_by(list(keys), use_threads=False).aggregate(list(specs.values()))
    states = {out: grouped[name] for out, name in names.items()}
    return pa.table({**{k: grouped[k] for k in keys}, **states})


ARROW_COMBINE = {"count": "sum", "sum": "sum", "avg": "sum", "min": "min", "max": "max"}
"""The pyarrow hash aggregate combining each state column of an unordered aggregate."""


def _canonical_sketch(a: Column, b: Column) -> Column:
    """The union of sketches ``a`` and ``b`` (either may be null), in the canonical form Spark's union gives:
    a sketch built from rows in one order estimates with another estimator than a union does
    (HIP), so a sketch is always stored as a union, and the same values give the same estimate."""
    from pyspark.sql import functions as F

    return F.hll_union(F.coalesce(a, b), F.coalesce(b, a))


def key_order(table: pa.Table, keys: list[str]) -> tuple[pa.Table, pa.Array]:
    """``table`` sorted by ``keys`` (nulls first) and the index of each key's first row."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    table = table.take(pc.sort_indices(table, [(k, "ascending", "at_start") for k in keys]))
    new = np.zeros(len(table), np.bool_)
    if len(table):
        new[0] = True
    for k in keys:
        a, b = table[k].slice(1), table[k].slice(0, max(len(table) - 1, 0))
        differs = pc.fill_null(pc.not_equal(a, b), False)
        differs = pc.or_(differs, pc.xor(pc.is_null(a), pc.is_null(b)))
        new[1:] |= differs.to_numpy(zero_copy_only=False)
    return table, pa.array(np.flatnonzero(new))
