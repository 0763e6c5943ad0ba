"""Arrow's parse of JSON values (``connectors/kafka/json_values.py``) against Spark's ``from_json``, the oracle.

A seeded corpus of messy values (escapes, surrogates, numbers at and past every limit, duplicate and
case-changed keys, nesting, invalid JSON): on every value Arrow accepts, Spark's ``from_json`` (as the
source calls it) gives the same row and calls it well-formed. Values Arrow refuses are Spark's to judge.
"""

from __future__ import annotations

import math
import os
import random
from typing import Any

import pyarrow as pa
import pytest

from airflow_provider_checkpoint.connectors.kafka.json_values import arrow_schema, parse
from airflow_provider_checkpoint.connectors.kafka.reader import _flaws


def _parse(values: list[bytes | None], schema: pa.Schema) -> pa.Array:
    array = pa.array(values, pa.binary())
    return parse(array, schema, _flaws(array))


pytestmark = pytest.mark.spark
SCHEMA = "user STRING, n INT, amount BIGINT, x DOUBLE, flag BOOLEAN"
FIELDS = [("user", "string"), ("n", "int"), ("amount", "bigint"), ("x", "double"), ("flag", "boolean")]
CORRUPT = "_corrupt_record"
KEYS = ["user", "n", "amount", "x", "flag", "User", "AMOUNT", "other", "user ", ""]
SCALARS = [
    '"u1"',
    '""',
    '"\\u00e9\\u20ac"',
    '"\\ud83d\\ude00"',
    '"\\ud800"',
    '"\\udc00x"',
    '"a\\nb\\t\\"\\\\\\/"',
    '"\\u0000"',
    '"\\q"',
    '"tab\there"',
    "'single'",
    '"é😀"',
    "0",
    "-0",
    "1",
    "-1",
    "01",
    "1.0",
    "1.5",
    "-0.0",
    "1e2",
    "1E-3",
    ".5",
    "5.",
    "+1",
    "0x10",
    "2147483647",
    "2147483648",
    "-2147483648",
    "-2147483649",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "1.7976931348623157e308",
    "1e400",
    "-1e400",
    "5e-324",
    "1e-400",
    "4.9406564584124654e-324",
    "0.1",
    "0.30000000000000004",
    "123456789012345678901234567890",
    "3.141592653589793238462643383279",
    "NaN",
    "Infinity",
    "-Infinity",
    '"NaN"',
    '"Infinity"',
    '"1.5"',
    '"12"',
    "true",
    "false",
    "null",
    '"true"',
    "True",
    "nul",
    "{}",
    '{"a": 1}',
    "[]",
    "[1, 2]",
    '["u"]',
]


def _number() -> str:
    rng = _RNG
    kind = rng.randrange(4)
    if kind == 0:
        return repr(rng.uniform(-1e6, 1e6))
    if kind == 1:
        return f"{rng.uniform(-1, 1):.{rng.randrange(1, 25)}e}"
    if kind == 2:
        return str(rng.randrange(-(2**70), 2**70))
    return f"{rng.randrange(10**6)}.{rng.randrange(10**20):020d}"


_RNG = random.Random(int(os.environ.get("KAFKA_JSON_SEED", "19")))


def _value() -> str:
    rng = _RNG
    members = []
    for _ in range(rng.randrange(5)):
        key = rng.choice(KEYS)
        scalar = rng.choice(SCALARS) if rng.random() < 0.6 else _number()
        members.append(f'"{key}"{rng.choice([":", " : ", ":  "])}{scalar}')
    body = rng.choice([", ", ","]).join(members)
    text = "{" + body + rng.choice(["", "", "", ",", " "]) + "}"
    return text + rng.choice(["", "", "", "", " ", "x", "{}", ' {"user": "z"}'])


def _corpus(n: int) -> list[bytes]:
    hand = ['{"user": "a", "user": "b"}', '{"user": "a"}{"user": "b"}', "{\n}", '{"user":"a"}\r', "{/*c*/}", "{}"]
    return [v.encode() for v in hand] + [_value().encode() for _ in range(n)]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    return type(a) is type(b) and a == b


def test_every_value_arrow_accepts_is_the_row_spark_gives(spark) -> None:
    from pyspark.sql import functions as F

    schema = arrow_schema(FIELDS, CORRUPT)
    assert schema is not None
    values = _corpus(int(os.environ.get("KAFKA_JSON_VALUES", "4000")))
    ours = [_parse([v], schema)[0].as_py() for v in values]
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}  # as KafkaSource calls it
    frame = spark.createDataFrame([(i, v) for i, v in enumerate(values)], "i INT, value BINARY")
    parsed = frame.select(
        "i", F.from_json(F.col("value").cast("string"), f"{SCHEMA}, {CORRUPT} STRING", options).alias("v")
    )
    theirs = {r["i"]: r["v"].asDict() if r["v"] is not None else None for r in parsed.collect()}
    accepted = [i for i, row in enumerate(ours) if row is not None]
    assert len(accepted) > len(values) // 10, "the corpus must hold values Arrow accepts"
    differ = [
        (values[i], ours[i], theirs[i])
        for i in accepted
        if theirs[i] is None or not all(_same(ours[i][k], theirs[i][k]) for k in [*dict(FIELDS), CORRUPT])
    ]
    assert not differ, f"{len(differ)} of {len(accepted)} accepted values differ from Spark's, e.g. {differ[:3]}"


def test_a_batch_is_parsed_whole_or_left_to_spark() -> None:
    schema = arrow_schema(FIELDS, CORRUPT)
    assert schema is not None
    good: list[bytes | None] = [b'{"user": "a", "n": 1}', b'{"amount": 5, "x": 1.5, "flag": true}']
    rows = _parse(good, schema).to_pylist()
    assert [r["user"] for r in rows] == ["a", None] and rows[1]["amount"] == 5 and rows[1][CORRUPT] is None
    for bad in (b'{"n": 1.5}', b'{"user": "a"}{"user": "b"}', b"{\n}", b'{"user": "a"} ', b'{"user": 5}'):
        assert _parse([*good, bad], schema).null_count == 3, bad
    flawed = _parse([None, good[0], b"", b"\xff", good[1]], schema).to_pylist()
    assert flawed[0] is None and flawed[2] is None and flawed[3] is None, "a flawed value is Spark's to parse"
    assert (flawed[1], flawed[4]) == (rows[0], rows[1]), "the flawless ones are Arrow's, in place"
    assert _parse([None, b""], schema).null_count == 2
    assert arrow_schema([("ts", "timestamp")], CORRUPT) is None and arrow_schema([("a b", "string")], CORRUPT) is None
    assert arrow_schema([("user", "string"), ("user", "int")], CORRUPT) is None
    assert arrow_schema([(CORRUPT, "string")], CORRUPT) is None
