"""Kafka positions and client configuration: pure rules, checked against independent models."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_checkpoint.connectors.kafka.client import check_config, consumer_config
from airflow_provider_checkpoint.connectors.kafka.offsets import Offsets, bounded, split
from airflow_provider_checkpoint.connectors.kafka.reader import FLAW, LOST, _Rows, _runs, value_flaw
from airflow_provider_checkpoint.exceptions import InvalidPositionError, KafkaSourceError

partitions = st.lists(st.tuples(st.sampled_from(["a", "b.c", "d-e_f"]), st.integers(0, 5)), unique=True, max_size=8)


@given(partitions, st.data())
def test_a_position_survives_its_json_and_ranges_cover_exactly_the_new_offsets(tps, data) -> None:
    previous = {tp: data.draw(st.integers(0, 1000)) for tp in tps if data.draw(st.booleans())}
    ends = {tp: previous.get(tp, 0) + data.draw(st.integers(0, 500)) for tp in tps}
    starts = {tp: data.draw(st.integers(0, ends[tp])) for tp in tps if tp not in previous}
    barrier = Offsets(ends, starts)
    assert Offsets.parse(barrier.to_json()) == barrier
    before = Offsets(previous)
    got = {tp: (s, e) for tp, s, e in barrier.ranges(before)}
    want = {tp: (previous.get(tp, starts.get(tp)), ends[tp]) for tp in tps}
    assert got == {tp: r for tp, r in want.items() if r[1] > r[0]}


@given(st.dictionaries(st.tuples(st.just("t"), st.integers(0, 9)), st.integers(0, 10_000), max_size=10), st.data())
def test_a_bounded_barrier_takes_at_most_the_limit_and_never_starves_a_backlog(backlogs, data) -> None:
    starts = {tp: data.draw(st.integers(0, 100)) for tp in backlogs}
    ends = {tp: starts[tp] + n for tp, n in backlogs.items()}
    limit = data.draw(st.integers(1, 20_000))
    cut = bounded(starts, ends, limit)
    taken = {tp: cut[tp] - starts[tp] for tp in ends}
    assert all(0 <= taken[tp] <= backlogs[tp] for tp in ends)
    assert sum(taken.values()) == min(limit, sum(backlogs.values()))
    if sum(backlogs.values()) > limit >= len(backlogs):
        assert all(taken[tp] > 0 for tp, n in backlogs.items() if n), "every backlog moves while the limit allows"


@given(st.lists(st.integers(0, 5000), min_size=1, max_size=6), st.integers(1, 40))
def test_split_ranges_cover_each_offset_once_in_order(sizes, tasks) -> None:
    ranges = [(("t", p), 10 * p, 10 * p + n) for p, n in enumerate(sizes)]
    pieces = split(ranges, tasks)
    covered = [(t, p, o) for t, p, s, e in pieces for o in range(s, e)]
    assert covered == [("t", p, o) for (_, p), s, e in ranges for o in range(s, e)]
    if sum(sizes):
        assert len(pieces) <= tasks + len(sizes)


@pytest.mark.parametrize(
    "value",
    [
        {"offsets": {"../x": {"0": 1}}},
        {"offsets": {"t": {"-1": 1}}},
        {"offsets": {"t": {"01": 1}}},
        {"offsets": {"t": {"0": -5}}},
        {"offsets": {"t": {"0": True}}},
        {"offsets": {"t": {"0": 2**63}}},
        {"offsets": {"t": {"0": 3}}, "starts": {"t": {"0": 9}}},
        {"offsets": {"t": {"0": 3}}, "starts": {"u": {"0": 1}}},
        {"offsets": {"t": {"0": 3}}, "ids": {"t": "a b"}},
        {"offsets": {"t": {"0": 3}}, "ids": {"../t": "abc"}},
        {"offsets": {"t": {"0": 3}}, "ids": ["t"]},
        {"offsets": [], "extra": 1},
        "offsets",
    ],
)
def test_a_forged_position_is_refused_naming_the_field(value) -> None:
    with pytest.raises(InvalidPositionError):
        Offsets.parse(value)


def test_a_recreated_topic_is_read_from_its_new_start_and_its_id_kept() -> None:
    """A barrier's start for a partition the previous position knows (its topic recreated) wins over the
    previous end; the reset is listed; the topic ids round-trip."""
    previous = Offsets({("t", 0): 25, ("t", 1): 25, ("u", 0): 4}, ids={"t": "old-id"})
    barrier = Offsets({("t", 0): 35, ("t", 1): 35, ("u", 0): 6}, {("t", 0): 0, ("t", 1): 0}, {"t": "new-id"})
    assert list(barrier.ranges(previous)) == [(("t", 0), 0, 35), (("t", 1), 0, 35), (("u", 0), 4, 6)]
    assert barrier.reset(previous) == [(("t", 0), 25, 0), (("t", 1), 25, 0)]
    assert Offsets.parse(barrier.to_json()) == barrier and "ids" not in Offsets({("t", 0): 1}).to_json()


def test_a_barrier_behind_its_previous_position_is_refused() -> None:
    with pytest.raises(InvalidPositionError, match=r"t\[0\]: the barrier's end offset 3 is before 7"):
        list(Offsets({("t", 0): 3}).ranges(Offsets({("t", 0): 7})))


def test_the_connection_extra_is_checked_and_secrets_never_shown() -> None:
    config = check_config("k", {"bootstrap.servers": "h:9092", "linger.ms": 5, "enable.idempotence": True})
    assert config == {"bootstrap.servers": "h:9092", "linger.ms": "5", "enable.idempotence": "true"}
    for extra, message in [
        ({}, "its extra must be a JSON object"),
        ({"linger.ms": 5}, "names no bootstrap.servers"),
        ({"bootstrap.servers": "h", "oauth_cb": "x.y"}, "callback oauth_cb is not supported"),
        ({"bootstrap.servers": "h", "Bad Key": "1"}, "is not a client property name"),
        ({"bootstrap.servers": "h", "sasl.password": {"nested": "hunter2"}}, "sasl.password must be a string"),
    ]:
        with pytest.raises(KafkaSourceError, match=message) as refused:
            check_config("k", extra)
        assert "hunter2" not in str(refused.value)
    ours = consumer_config({"bootstrap.servers": "h", "group.id": "theirs", "enable.auto.commit": "true"})
    assert ours["enable.auto.commit"] is False and ours["group.id"].startswith("airflow-checkpoint-read-")


def test_an_unreachable_broker_is_named_within_the_timeout(monkeypatch) -> None:
    """Nothing listens at the connection's address: the trigger's question fails naming it, never hangs."""
    import socket

    from airflow_provider_checkpoint.connectors.kafka import client
    from airflow_provider_checkpoint.exceptions import KafkaUnavailableError

    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
        monkeypatch.setattr(client, "TIMEOUT_SECONDS", 0.5)
        with (
            client.Broker({"bootstrap.servers": address}) as broker,
            pytest.raises(KafkaUnavailableError, match=rf"Kafka broker {address} cannot be reached"),
        ):
            broker.partitions(["clicks"], None)


def test_a_refused_login_is_named_at_once_by_every_client_path(tmp_path) -> None:
    """Against a broker refusing every SASL login (Tansu with authentication), the trigger's questions,
    the group commit and an executor's read each raise the refusal within seconds (not the 30 s
    timeout), naming the connection and the address, never the password; the read's is marked for
    the driver. An ``_AUTHENTICATION`` error saying the connection broke is no refusal (retried)."""
    import time

    from confluent_kafka import KafkaError

    from airflow_provider_checkpoint.connectors.kafka import client, reader, refusals
    from airflow_provider_checkpoint.exceptions import raised_in_spark
    from tests.servers.kafka import Tansu
    from tests.servers.s3 import free_ports

    guarded = Tansu(free_ports(1)[0], tmp_path / "tansu.log", authentication=True)
    guarded.start()
    password = "hunter2-not-shown"
    config = guarded.sasl_config("etl", password)
    refused = f"Kafka connection 'k': the broker {guarded.servers} refused the credentials"

    def partitions() -> object:
        with client.Broker(config, "k") as broker:
            return broker.partitions(["clicks"], None)

    try:
        for call in (
            partitions,
            lambda: client.commit(config, "g", {("clicks", 0): 5}, "k"),
            lambda: client.committed(config, "g", [("clicks", 0)], "k"),
            lambda: list(reader.read_range(config, ("clicks", 0, 0, 10), True, "k")),
        ):
            started = time.monotonic()
            with pytest.raises(KafkaSourceError) as raised:
                call()
            assert time.monotonic() - started < 10 and refused in str(raised.value)
            assert password not in str(raised.value)
        assert raised_in_spark(RuntimeError(f"Py4J ... {raised.value}\n at ...")) is not None, "the read's is marked"
    finally:
        guarded.stop()
    cut = KafkaError(KafkaError._AUTHENTICATION, "SASL handshake failed: Local: Broker transport failure")
    assert not refusals.refused(cut) and refusals.refused(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    error = KafkaError(KafkaError.SASL_AUTHENTICATION_FAILED, f"invalid credentials {password}")
    assert password not in str(refusals.refusal("k", config, error))


@pytest.mark.parametrize(
    ("value", "flaw"),
    [
        (None, "a tombstone (null value), not a record"),
        (b"", "an empty value, not a record"),
        (b'{"user": "\xff"}', "not valid UTF-8: invalid start byte at byte 10"),
        (b'{"user": "\xc3"}', "not valid UTF-8: invalid continuation byte at byte 10"),
        (b'{"user": "\xed\xa0\x80"}', "not valid UTF-8: invalid continuation byte at byte 10"),  # a surrogate
        (b"{not json", None),  # parses badly: from_json's to judge, not a flaw of the bytes
        ('{"user": "é€😀"}'.encode(), None),
        (b" ", None),
    ],
)
def test_a_value_that_cannot_be_a_text_record_names_why(value: bytes | None, flaw: str | None) -> None:
    assert value_flaw(value) == flaw


@given(st.text(min_size=1))
def test_every_non_empty_utf8_text_is_readable(text: str) -> None:
    assert value_flaw(text.encode("utf-8")) is None
    assert value_flaw(text.encode("utf-8") + b"\x80") is not None, "a lone continuation byte is never UTF-8"


class _Message:
    def __init__(self, value: bytes | None, offset: int = 0) -> None:
        self._value, self._offset = value, offset

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> None:
        return None

    def offset(self) -> int:
        return self._offset

    def error(self) -> None:
        return None


@pytest.mark.parametrize("text", [True, False])
def test_read_batches_carry_the_flaws_only_for_text_formats(text: bool) -> None:
    values = [b'{"a": 1}', None, b"", b"\xff"]
    rows = _Rows("t", 0, text)
    rows.add([_Message(v) for v in values[:1]], [0])
    rows.add([_Message(v) for v in values[1:]], [1, 2, 3])
    batch = rows.batch(lost=3)
    assert batch.column("value").to_pylist() == [*values, None], "the bytes as received, null kept"
    assert batch.column("offset").to_pylist() == [0, 1, 2, 3, None]
    flaws = [value_flaw(v) for v in values] if text else [None] * 4
    assert batch.column(FLAW).to_pylist() == [*flaws, None]
    assert batch.column(LOST).to_pylist() == [0, 0, 0, 0, 3]


@given(st.lists(st.one_of(st.none(), st.binary(max_size=8), st.text(max_size=4).map(str.encode)), max_size=6))
def test_a_batch_s_flaws_are_each_value_s_flaw(values: list[bytes | None]) -> None:
    """Arrow's check of a whole batch agrees with Python's strict UTF-8 decoder, record by record."""
    rows = _Rows("t", 0, True)
    rows.add([_Message(v, i) for i, v in enumerate(values)], list(range(len(values))))
    assert rows.batch().column(FLAW).to_pylist() == [value_flaw(v) for v in values]


def test_runs_split_records_from_error_events_in_order() -> None:
    class _Event(_Message):
        def error(self) -> str:  # type: ignore[override]
            return "eof"

    a, b, e, c = _Message(b"a", 0), _Message(b"b", 1), _Event(None, 2), _Message(b"c", 3)
    assert list(_runs([a, b, e, c])) == [([a, b], None), ([], e), ([c], None)]
    assert list(_runs([e])) == [([], e)] and list(_runs([])) == []
