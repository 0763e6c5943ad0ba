"""Graph validation and the split of a pipeline into steps."""

from __future__ import annotations

import pytest

from airflow_provider_checkpoint.dataflow.graph import (
    Node,
    Sink,
    Source,
    Transform,
    collecting,
)
from airflow_provider_checkpoint.dataflow.operator import StatefulOperator
from airflow_provider_checkpoint.dataflow.planner import PipelineGraph
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError


class Join(Node):
    """A node with two inputs (the built-ins have one), to exercise step merging."""

    kind = "join"


def step_of(graph: PipelineGraph, uid: str) -> str:
    owners = [name for name, nodes in graph.steps.items() if any(n.uid == uid for n in nodes)]
    assert len(owners) == 1, f"{uid} is in steps {owners}"
    return owners[0]


def sinks_per_step(graph: PipelineGraph) -> list[set[str]]:
    return sorted(({n.uid for n in nodes if isinstance(n, Sink)} for nodes in graph.steps.values()), key=sorted)


def test_duplicate_uid_is_rejected() -> None:
    src = Source("events")
    other = Source("events")
    sink = Sink("out", src)
    with pytest.raises(PipelineDefinitionError, match="duplicate uid 'events'"):
        PipelineGraph([src, other, sink])


def test_pipeline_without_sink_is_rejected() -> None:
    src = Source("events")
    agg = StatefulOperator("counts", src, keys=["k"])
    with pytest.raises(PipelineDefinitionError, match="sink"):
        PipelineGraph([src, agg])


def test_input_outside_the_pipeline_is_rejected() -> None:
    src = Source("events")
    sink = Sink("out", src)
    with pytest.raises(PipelineDefinitionError, match="events"):
        PipelineGraph([sink])


def test_same_uid_object_swapped_is_rejected() -> None:
    src = Source("events")
    impostor = Source("events")
    sink = Sink("out", src)
    with pytest.raises(PipelineDefinitionError):
        PipelineGraph([impostor, sink])


def test_sink_cannot_be_an_input() -> None:
    src = Source("events")
    sink = Sink("out", src)
    with pytest.raises(PipelineDefinitionError):
        Transform("t", sink, lambda df: df)


@pytest.mark.parametrize("uid", ["", "_hidden", ".dot", "has space", "slash/x", "x" * 101])
def test_invalid_uids_are_rejected(uid: str) -> None:
    with pytest.raises(PipelineDefinitionError):
        Source(uid)


def test_stateful_operator_needs_keys_and_sane_max_parallelism() -> None:
    src = Source("events")
    with pytest.raises(PipelineDefinitionError):
        StatefulOperator("a", src, keys=[])
    with pytest.raises(PipelineDefinitionError):
        StatefulOperator("b", src, keys=["k"], max_parallelism=0)
    with pytest.raises(PipelineDefinitionError):
        StatefulOperator("c", src, keys=["k"], max_parallelism=32769)


def test_sinks_sharing_a_stateful_operator_run_in_one_step() -> None:
    src = Source("events")
    counts = StatefulOperator("counts", src, keys=["page"])
    a = Sink("table_a", counts)
    b = Sink("table_b", Transform("filtered", counts, lambda df: df))
    graph = PipelineGraph([src, counts, a, b, *b.inputs])
    assert len(graph.steps) == 1
    assert step_of(graph, "table_a") == step_of(graph, "table_b") == step_of(graph, "counts")
    nodes = next(iter(graph.steps.values()))
    assert [n.uid for n in nodes].count("counts") == 1, "a shared node runs once per step"


def test_independent_sinks_run_in_separate_steps() -> None:
    src = Source("events")
    views = StatefulOperator("views", src, keys=["page"])
    totals = StatefulOperator("totals", src, keys=["user"])
    a = Sink("views_table", views)
    b = Sink("totals_table", totals)
    c = Sink("archive", src)  # stateless: shares only the source
    graph = PipelineGraph([src, views, totals, a, b, c])
    assert sinks_per_step(graph) == [{"archive"}, {"totals_table"}, {"views_table"}]
    assert step_of(graph, "views") != step_of(graph, "totals")
    # The source is read by every step that needs it.
    assert all(nodes[0].uid == "events" for nodes in graph.steps.values())


def test_a_sink_bridging_two_groups_merges_them() -> None:
    src = Source("events")
    s1 = StatefulOperator("s1", src, keys=["k"])
    s2 = StatefulOperator("s2", src, keys=["k"])
    a = Sink("a", s1)
    b = Sink("b", s2)
    both = Join("both", [s1, s2])
    c = Sink("c", both)
    d = Sink("d", src)
    graph = PipelineGraph([src, s1, s2, a, b, both, c, d])
    assert sinks_per_step(graph) == [{"a", "b", "c"}, {"d"}]


def test_sinks_behind_chained_stateful_operators_share_a_step() -> None:
    src = Source("events")
    s1 = StatefulOperator("s1", src, keys=["k"])
    s2 = StatefulOperator("s2", s1, keys=["k"])
    a = Sink("a", s1)
    b = Sink("b", s2)
    graph = PipelineGraph([src, s1, s2, a, b])
    assert sinks_per_step(graph) == [{"a", "b"}]


def test_every_node_of_a_step_comes_after_its_inputs() -> None:
    src = Source("events")
    t = Transform("t", src, lambda df: df)
    s1 = StatefulOperator("s1", t, keys=["k"])
    s2 = StatefulOperator("s2", s1, keys=["k"])
    sink = Sink("out", s2)
    graph = PipelineGraph([sink, s2, s1, t, src])  # declaration order reversed on purpose
    for nodes in graph.steps.values():
        position = {n.uid: i for i, n in enumerate(nodes)}
        for n in nodes:
            for inp in n.inputs:
                assert position[inp.uid] < position[n.uid]


def test_topology_lists_nodes_and_steps() -> None:
    src = Source("events")
    counts = StatefulOperator("counts", src, keys=["page"], max_parallelism=64)
    sink = Sink("out", counts)
    topo = PipelineGraph([src, counts, sink]).topology()
    assert topo["nodes"]["counts"] == {
        "kind": "stateful",
        "inputs": ["events"],
        "keys": ["page"],
        "max_parallelism": 64,
    }
    assert list(topo["steps"].values()) == [["events", "counts", "out"]]


def test_collecting_registers_declared_nodes_in_order() -> None:
    outside = Source("outside")
    with collecting() as nodes:
        src = Source("events")
        sink = Sink("out", src)
    assert nodes == [src, sink]
    assert outside not in nodes


def test_sinks_whose_step_names_collide_are_refused() -> None:
    src = Source("events")
    a = Sink("out-1", src)
    b = Sink("out_1", src)
    with pytest.raises(PipelineDefinitionError, match="rename one of them"):
        PipelineGraph([src, a, b])


def test_sinks_with_the_same_step_name_run_in_one_step() -> None:
    src = Source("events")
    a = Sink("archive", src, step="main")
    b = Sink("mirror", src, step="main")
    c = Sink("other", src)
    graph = PipelineGraph([src, a, b, c])
    assert {name: [n.uid for n in nodes] for name, nodes in graph.steps.items()} == {
        "step_main": ["events", "archive", "mirror"],
        "step_other": ["events", "other"],
    }


def test_a_channel_splits_the_graph_into_dependent_steps() -> None:
    from airflow_provider_checkpoint.dataflow.channel import Channel

    with collecting() as nodes:
        src = Source("events")
        state = StatefulOperator("counts", src, keys=["k"])
        channel = Channel("counted", state, step="count")
        Sink("table", channel, step="publish")
        Sink("archive", Transform("tidy", channel, lambda df: df), step="publish")
    graph = PipelineGraph(nodes)
    assert list(graph.steps) == ["step_count", "step_publish"]
    assert [n.uid for n in graph.steps["step_count"]] == ["events", "counts", "counted"]
    assert [n.uid for n in graph.steps["step_publish"]] == ["counted", "table", "tidy", "archive"]
    assert graph.channel_steps == {"counted": "step_count"}
    assert graph.reads("step_publish") == ["counted"] and graph.upstream_steps("step_publish") == ["step_count"]
    assert graph.topology()["channels"] == {"counted": "step_count"}


def test_steps_that_read_each_others_channels_are_refused() -> None:
    from airflow_provider_checkpoint.dataflow.channel import Channel

    with collecting() as nodes:
        src = Source("events")
        shared = StatefulOperator("shared", src, keys=["k"])
        a = Channel("a", shared, step="one")
        b_state = StatefulOperator("b_state", a, keys=["k"])
        b = Channel("b", b_state, step="two")
        # a sink in step one that reads step two's channel and shares step one's state: a cycle
        Sink("loop", Join("join", [b, shared]), step="one")
    with pytest.raises(PipelineDefinitionError, match="in a cycle"):
        PipelineGraph(nodes)


def test_union_needs_two_inputs_and_co_functions_two_named_inputs() -> None:
    from airflow_provider_checkpoint.dataflow import KeyedCoStateFunction, Union

    src = Source("events")
    with pytest.raises(PipelineDefinitionError, match="at least two inputs"):
        Union("u", [src])
    with pytest.raises(PipelineDefinitionError, match="at least two named inputs"):
        KeyedCoStateFunction("f", {"only": src}, ["k"], lambda inputs, state: (state, state), "k STRING")
    with pytest.raises(PipelineDefinitionError, match="the same input is given twice"):
        StatefulOperator("twice", [src, src], keys=["k"])
