"""The per-key process function without Spark: timer order, TTL rules, state declarations and their errors."""

from __future__ import annotations

import datetime
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from airflow_provider_checkpoint.core.keyed_process import (
    MAX_FIRINGS,
    Clocks,
    KeyedProcessFunction,
    KeyState,
    ListState,
    MapState,
    ValueState,
    check_function,
    run_key,
    to_ms,
)
from airflow_provider_checkpoint.core.ttl import TTL
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

UTC = datetime.UTC


class Recorder(KeyedProcessFunction):
    """Registers the timers it is given, records every call, chains one timer from another."""

    output_schema = "what STRING, at LONG"
    states = (ValueState("n", "long"), ListState("seen", "string", ttl=TTL("10 ms", time="event")))

    def __init__(self, event: list[int] = [], processing: list[int] = [], chain: bool = False) -> None:  # noqa: B006
        self.event, self.processing, self.chain = event, processing, chain

    def process(self, key: Any, rows: Any, ctx: Any) -> Any:
        for t in self.event:
            ctx.register_event_time_timer(t)
        for t in self.processing:
            ctx.register_processing_time_timer(t)
        ctx.state("n").update(len(rows))
        ctx.state("seen").extend(rows)
        return [("rows", ctx.watermark)]

    def on_timer(self, key: Any, timer: Any, ctx: Any) -> Any:
        if self.chain and timer.timestamp < 30:
            ctx.register_event_time_timer(timer.timestamp + 10)
        yield {"what": timer.kind, "at": timer.timestamp}


def run(fn: KeyedProcessFunction, rows: Any, stored: str | None, clocks: Clocks) -> Any:
    specs = check_function("op", fn)
    return run_key("op", fn, specs, ["what", "at"], ("k",), rows, stored, clocks)


def test_rows_then_due_timers_in_timestamp_order_event_time_first_at_a_tie() -> None:
    fn = Recorder(event=[20, 5, 50], processing=[20, 1_000])
    result = run(fn, ["x"], None, Clocks(before=0, after=20, processing=100))
    assert result.emitted == [("rows", 0), ("event_time", 5), ("event_time", 20), ("processing_time", 20)]
    assert KeyState.loads(result.state).timers == {(50, "event_time"), (1_000, "processing_time")}
    assert result.wake == (10 + 20, 1_000)  # the list's expiry (watermark 20 + 10 ms) is before the timer at 50


def test_a_timer_registered_while_firing_fires_in_the_same_checkpoint_when_due() -> None:
    result = run(Recorder(event=[10], chain=True), ["x"], None, Clocks(0, 25, 0))
    assert [e for e in result.emitted if e[0] == "event_time"] == [("event_time", 10), ("event_time", 20)]
    assert (30, "event_time") in KeyState.loads(result.state).timers


def test_registering_a_timer_twice_keeps_one_and_no_watermark_fires_no_event_timer() -> None:
    result = run(Recorder(event=[5, 5]), ["x"], None, Clocks(None, None, 0))
    assert result.emitted == [("rows", None)]
    assert KeyState.loads(result.state).timers == {(5, "event_time")}


def test_a_timer_that_keeps_registering_due_timers_is_stopped_with_the_fix() -> None:
    class Loop(Recorder):
        def on_timer(self, key: Any, timer: Any, ctx: Any) -> Any:
            ctx.register_event_time_timer(timer.timestamp + 1)

    with pytest.raises(RuntimeError, match=f"more than {MAX_FIRINGS} timers.*register the next one later"):
        run(Loop(event=[0]), ["x"], None, Clocks(0, 10**9, 0))


def test_expired_entries_are_never_read_back_and_an_empty_key_is_dropped() -> None:
    first = run(Recorder(), ["a", "b"], None, Clocks(0, 100, 0))
    assert first.wake == (110, None)
    seen: list[Any] = []

    class Reader(Recorder):
        def process(self, key: Any, rows: Any, ctx: Any) -> Any:
            seen.append(ctx.state("seen").get())
            ctx.state("n").clear()

    assert run(Reader(), ["c"], first.state, Clocks(100, 109, 0)).state is not None
    assert seen == [["a", "b"]]  # 110 > 109: alive
    assert run(Reader(), ["c"], first.state, Clocks(109, 110, 0)).state is None
    assert seen[-1] == []  # expiry 110 <= watermark 110: gone, and nothing is left of the key
    visit = run(Recorder(), None, first.state, Clocks(100, 110, 0))  # a visit without rows drops it too
    assert KeyState.loads(visit.state).entries == {"n": [2, None]}
    assert (first.expired, visit.expired) == (0, 2)  # each element of a list counts


def test_an_expired_value_counts_once() -> None:
    class Value(Recorder):
        states = (ValueState("n", "long", ttl=TTL("10 ms", time="event")),)

        def process(self, key: Any, rows: Any, ctx: Any) -> Any:
            ctx.state("n").update(len(rows))

    written = run(Value(), ["a"], None, Clocks(0, 100, 0))
    assert (written.expired, run(Value(), None, written.state, Clocks(100, 110, 0)).expired) == (0, 1)


def test_ttl_on_read_and_write_refreshes_on_read_and_on_write_does_not() -> None:
    class Reads(KeyedProcessFunction):
        output_schema = "x LONG"
        states = (
            MapState("m", "string", "long", ttl=TTL("100 ms", update="on_read_and_write")),
            ValueState("v", "long", ttl="100 ms"),
        )

        def process(self, key: Any, rows: Any, ctx: Any) -> Any:
            if rows == "write":
                ctx.state("m").put("a", 1)
                ctx.state("v").update(1)
            return [(ctx.state("m").get("a"), ctx.state("v").get())][:0]

    fn, specs = Reads(), check_function("op", Reads())
    written = run_key("op", fn, specs, ["x"], ("k",), "write", None, Clocks(None, None, 1_000))
    read = run_key("op", fn, specs, ["x"], ("k",), "read", written.state, Clocks(None, None, 1_050))
    entries = KeyState.loads(read.state).entries
    assert entries["m"] == [["a", 1, 1_150]] and entries["v"] == [1, 1_100]
    later = KeyState.loads(run_key("op", fn, specs, ["x"], ("k",), "read", read.state, Clocks(None, None, 1_100)).state)
    assert "v" not in later.entries and later.entries["m"] == [["a", 1, 1_200]]


def test_state_values_are_checked_against_their_declared_type() -> None:
    class Typed(KeyedProcessFunction):
        output_schema = "x LONG"
        states = (ValueState("at", "timestamp"), MapState("m", "long", "double"))

        def process(self, key: Any, rows: Any, ctx: Any) -> Any:
            if rows[0] == "m":
                ctx.state("m").put(*rows[1])
            else:
                ctx.state(rows[0]).update(rows[1])

    def go(rows: Any) -> Any:
        return run_key("op", Typed(), check_function("op", Typed()), ["x"], ("k",), rows, None, Clocks(None, None, 0))

    when = datetime.datetime(2026, 3, 1, tzinfo=UTC)
    assert KeyState.loads(go(("at", when)).state).entries["at"][0] == to_ms(when, "t")
    with pytest.raises(TypeError, match="state 'at' is declared timestamp; '2026' is a str"):
        go(("at", "2026"))
    with pytest.raises(TypeError, match="state 'm' is declared long"):
        go(("m", ("a", 1.0)))
    with pytest.raises(KeyError, match="state 'nope' is not declared; add it to states"):
        go(("nope", 1))


def test_emitted_rows_must_fit_the_output_schema() -> None:
    class Bad(KeyedProcessFunction):
        output_schema = "what STRING, at LONG"

        def process(self, key: Any, rows: Any, ctx: Any) -> Any:
            return rows

    with pytest.raises(ValueError, match=r"emitted column\(s\) \['other'\] not in output_schema"):
        run(Bad(), [{"other": 1}], None, Clocks(None, None, 0))
    with pytest.raises(ValueError, match="a dict or a tuple of 2 values"):
        run(Bad(), [(1,)], None, Clocks(None, None, 0))
    table = pa.table({"at": [1, 2], "what": ["a", None]})
    assert run(Bad(), table, None, Clocks(None, None, 0)).emitted == [("a", 1), (None, 2)]  # by name
    with pytest.raises(ValueError, match=r"lack output column\(s\) \['what'\]"):
        run(Bad(), table.drop_columns(["what"]), None, Clocks(None, None, 0))


def test_times_are_ms_from_datetimes_naive_ones_utc() -> None:
    assert to_ms(datetime.datetime(1970, 1, 1, 0, 0, 1), "t") == 1000
    assert to_ms(datetime.datetime(1970, 1, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=1))), "t") == 0
    with pytest.raises(TypeError, match="not a time; give a datetime or an int of ms"):
        to_ms("soon", "t")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Recorder, "must be an instance; write Recorder\\(\\)"),
        (lambda: object(), "instance of a KeyedProcessFunction subclass"),
        (lambda: type("NoOut", (Recorder,), {"output_schema": ""})(), "has no output_schema; declare the rows"),
        (lambda: type("NoProcess", (KeyedProcessFunction,), {"output_schema": "a INT"})(), "must define process"),
        (lambda: type("Twice", (Recorder,), {"states": (ValueState("a", "long"),) * 2})(), "state 'a' twice"),
        (
            lambda: type("Odd", (Recorder,), {"states": (ValueState("a", "decimal"),)})(),
            "type 'decimal' is not supported",
        ),
        (lambda: type("MapKey", (Recorder,), {"states": (MapState("m", "json", "long"),)})(), "not json for a map key"),
        (
            lambda: type("Ttl", (Recorder,), {"states": (ValueState("a", "long", ttl=TTL("1 h", "wall")),)})(),
            "TTL time must be one of processing, event, got 'wall'",
        ),
        (
            lambda: type("Ttl0", (Recorder,), {"states": (ValueState("a", "long", ttl="0 s"),)})(),
            "ttl must be positive",
        ),
        (lambda: type("Polars", (Recorder,), {"rows_format": "polars"})(), "rows_format 'polars' is not one of"),
    ],
)
def test_bad_definitions_are_refused_naming_the_node_and_the_fix(make: Any, message: str) -> None:
    with pytest.raises(PipelineDefinitionError, match=f"^op: .*{message}"):
        check_function("op", make())


def test_a_keyed_process_is_checked_with_the_pipeline_at_parse_time(tmp_path: Any) -> None:
    from airflow_provider_checkpoint.dataflow import FileSource, KeyedProcess, ParquetTableSink
    from airflow_provider_checkpoint.dataflow.validation import validate_pipeline

    events = FileSource(uid="events", path=str(tmp_path / "landing"), format="json", schema="user STRING, ts LONG")
    alerts = KeyedProcess("alerts", events, ["usr"], Recorder(), watermark=("ts", "1 minute"))
    sink = ParquetTableSink("out", alerts, str(tmp_path / "out"), "upsert", keys=["what", "nope"])
    found = [(p.uid, p.field, p.message) for p in validate_pipeline([events, alerts, sink])]
    assert found == [
        ("alerts", "keys", "'usr' not among the columns of input events (user, ts)"),
        ("alerts", "watermark", "'ts' is bigint, not a timestamp"),
        ("out", "keys", "'nope' not among the columns of input alerts (what, at)"),
    ]


def test_a_keyed_process_definition_that_cannot_run_is_refused(tmp_path: Any) -> None:
    from airflow_provider_checkpoint.dataflow import FileSource, KeyedProcess

    events = FileSource(uid="events", path=str(tmp_path / "landing"), format="json", schema="user STRING, ts TIMESTAMP")
    with pytest.raises(PipelineDefinitionError, match=r"^p: state \['seen'\] with an event-time TTL needs a watermark"):
        KeyedProcess("p", events, ["user"], Recorder())
    internal = type("Internal", (Recorder,), {"output_schema": "__x LONG"})()
    with pytest.raises(PipelineDefinitionError, match=r"^q: output column\(s\) \['__x'\] start with '__'"):
        KeyedProcess("q", events, ["user"], internal, watermark=("ts", "1 minute"))
    broken = type("Broken", (Recorder,), {"output_schema": "a BLOB"})()
    with pytest.raises(PipelineDefinitionError, match="^r: output_schema 'a BLOB' is not a valid schema"):
        KeyedProcess("r", events, ["user"], broken, watermark=("ts", "1 minute"))


def test_a_function_defined_in_a_dag_file_reaches_a_fresh_python_by_value(tmp_path: Any) -> None:
    """Airflow loads a DAG file under a name no other process can import: its class must travel by value."""
    import importlib.util
    import subprocess
    import sys

    from pyspark import cloudpickle

    from airflow_provider_checkpoint.dataflow.keyed_process import ship_by_value

    dag = tmp_path / "my_dag.py"
    dag.write_text(
        "from airflow_provider_checkpoint import KeyedProcessFunction\n"
        "class F(KeyedProcessFunction):\n"
        "    output_schema = 'a INT'\n"
        "    def process(self, key, rows, ctx):\n"
        "        return [(41 + 1,)]\n"
    )
    spec = importlib.util.spec_from_file_location("unusual_prefix_0_my_dag", dag)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        ship_by_value(module.F())
        code = "import pickle, sys; print(pickle.loads(sys.stdin.buffer.read()).process(None, None, None))"
        out = subprocess.run(
            [sys.executable, "-c", code], input=cloudpickle.dumps(module.F()), capture_output=True, check=True
        )
    finally:
        del sys.modules[spec.name]
    assert out.stdout.decode().strip() == "[(42,)]"


def test_emitted_values_convert_as_spark_safe_cast_does() -> None:
    """An emitted fraction into an integer column is refused naming the column (pyarrow alone would
    truncate 2.5 to 2); whole floats, NaN and NaT are taken (NaN and NaT as null)."""
    from airflow_provider_checkpoint.dataflow.keyed_process import _column

    long, ts = pa.field("n", pa.int64()), pa.field("at", pa.timestamp("us", tz="UTC"))
    assert _column("op", "n", [1.0, float("nan"), 3], long).to_pylist() == [1, None, 3]
    with pytest.raises(ValueError, match=r"^op: an emitted value of column 'n' is not a int64: .*truncated"):
        _column("op", "n", [2.5], long)
    when = datetime.datetime(2026, 3, 1, tzinfo=UTC)
    assert _column("op", "at", [pd.NaT, when, None], ts).to_pylist() == [None, when, None]
    with pytest.raises(ValueError, match="column 'at' is not a timestamp"):
        _column("op", "at", ["soon"], ts)
