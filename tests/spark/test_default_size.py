"""A row's default size as Spark's plan statistics take it (``DataType.defaultSize``), computed without a JVM (a
Spark Connect client has none): :func:`~airflow_provider_checkpoint.dataflow.driver_rows.default_size` against the
embedded JVM's own answer for schemas drawn by Hypothesis, and ``None`` for a type it does not know."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from airflow_provider_checkpoint.dataflow.driver_rows import default_size

ATOMIC = [
    T.BooleanType(), T.ByteType(), T.ShortType(), T.IntegerType(), T.LongType(), T.FloatType(), T.DoubleType(),
    T.DateType(), T.TimestampType(), T.TimestampNTZType(), T.StringType(), T.BinaryType(), T.NullType(),
    T.CalendarIntervalType(), T.DecimalType(10, 2), T.DecimalType(18, 0), T.DecimalType(19, 4), T.DecimalType(38, 9),
]  # fmt: skip


def _types(children: st.SearchStrategy[T.DataType]) -> st.SearchStrategy[T.DataType]:
    return st.one_of(
        st.builds(T.ArrayType, children),
        st.builds(T.MapType, st.sampled_from(ATOMIC), children),
        st.lists(children, min_size=1, max_size=3).map(
            lambda ts: T.StructType([T.StructField(f"c{i}", t) for i, t in enumerate(ts)])
        ),
    )


TYPES = st.recursive(st.sampled_from(ATOMIC), _types, max_leaves=6)


@settings(max_examples=30, deadline=None)
@given(st.lists(TYPES, min_size=1, max_size=5))
def test_the_default_size_of_a_row_is_the_jvms(spark: SparkSession, types: list[T.DataType]) -> None:
    schema = T.StructType([T.StructField(f"c{i}", t) for i, t in enumerate(types)])
    jvm = spark._jvm
    assert jvm is not None
    expected = jvm.org.apache.spark.sql.types.DataType.fromJson(schema.json()).defaultSize()
    assert default_size(schema) == expected


def test_a_type_it_does_not_know_gives_no_size() -> None:
    schema = T.StructType([T.StructField("a", T.LongType()), T.StructField("v", T.VariantType())])
    assert default_size(schema) is None
