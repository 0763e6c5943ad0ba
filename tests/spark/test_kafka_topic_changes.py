"""KafkaSource against Apache Kafka's own broker where its semantics matter: a topic deleted and
recreated between checkpoints, and transactional producers (committed and aborted transactions) in
the source's input. Ground truth is what the test produced, with the offsets the broker gave."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pandas as pd
import pyarrow.dataset as ds
import pytest

from airflow_provider_checkpoint.connectors.kafka.source import KafkaSource
from airflow_provider_checkpoint.dataflow import ParquetTableSink
from airflow_provider_checkpoint.exceptions import KafkaSourceError
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore
from airflow_provider_checkpoint.testing.inprocess import make_job
from tests.servers.kafka import KafkaBroker

pytestmark = pytest.mark.spark
SCHEMA = "user STRING, amount LONG"


@pytest.fixture
def kafka(kafka_broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch) -> KafkaBroker:
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_TEST", kafka_broker.uri())
    return kafka_broker


def pipeline(topic: str, **options):
    def declare(tmp: Path) -> None:
        events = KafkaSource("events", [topic], kafka_config_id="kafka_test", schema=SCHEMA, **options)
        ParquetTableSink("events_table", events, str(tmp / "events"), mode="append")

    return declare


def records(partitions: int, each: int, tag: str) -> list[tuple[int, bytes, bytes]]:
    """``each`` records per partition; ``amount`` numbers them, ``user`` carries ``tag``."""
    return [
        (p, tag.encode(), json.dumps({"user": f"{tag}-{p}", "amount": i}).encode())
        for i in range(each)
        for p in range(partitions)
    ]


def table(tmp: Path) -> list[tuple[int, int, str, int]]:
    """``(partition, offset, user, amount)`` of every row of the append table, sorted."""
    got = ds.dataset(str(tmp / "events"), format="parquet").to_table().to_pandas()
    return sorted(got[["partition", "offset", "user", "amount"]].itertuples(index=False, name=None))


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_recreated_topic_is_refused_or_read_again_from_its_beginning(spark, kafka, tmp_path, fail_on_data_loss):
    """Checkpointed at 25/25, the topic deleted and recreated with 35 records per partition: never read
    from the old offsets (which would skip 50 acknowledged records without a word)."""
    topic = f"evt-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 2)
    old = kafka.produce(topic, records(2, 25, "old"))
    job = make_job(spark, tmp_path, pipeline(topic, fail_on_data_loss=fail_on_data_loss))
    assert job.checkpoint().stats["records_in"] == 50
    kafka.recreate_topic(topic, 2)
    new = kafka.produce(topic, records(2, 35, "new"))
    assert sorted(new) == [(p, o) for p in range(2) for o in range(35)]

    def rows(sent: list[tuple[int, int]], tag: str, each: int) -> list[tuple[int, int, str, int]]:
        return [(p, o, f"{tag}-{p}", o) for p, o in sent]

    if fail_on_data_loss:
        before = table(tmp_path)
        with pytest.raises(KafkaSourceError, match=rf"(?s)deleted and recreated.*{topic}: its topic id changed.*"
                           r"fail_on_data_loss=False") as refused:  # fmt: skip
            job.checkpoint()
        assert "no end of partition" not in str(refused.value)
        assert CompletedCheckpointStore(job.storage).completed_ids() == [1], "nothing committed"
        assert table(tmp_path) == before == sorted(rows(old, "old", 25))
    else:
        done = job.checkpoint()
        assert done.stats["records_in"] == 70, "all 35 of each partition of the new topic"
        assert table(tmp_path) == sorted(rows(old, "old", 25) + rows(new, "new", 35))
        resets = [m["source_reset"]["events"] for m in done.stats["steps"].values() if "source_reset" in m]
        assert resets == [{f"{topic}[0]": [25, 0], f"{topic}[1]": [25, 0]}]
        kafka.produce(topic, [(0, b"k", json.dumps({"user": "later", "amount": 1}).encode())])
        assert job.checkpoint().stats["records_in"] == 1, "then on from the new topic's offsets"


def test_read_committed_reads_exactly_the_committed_transactions(spark, kafka, tmp_path):
    """An aborted transaction first (the first range starts with records a read_committed consumer skips:
    not lost), committed ones and plain records, and one still open at a barrier: each checkpoint reads
    exactly the committed records below the last stable offset, the open transaction's once it commits."""
    from confluent_kafka import Producer

    topic = f"evt-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 2)
    job = make_job(spark, tmp_path, pipeline(topic))
    sent = kafka.produce_transactions(
        topic, [(False, records(2, 7, "b")), (True, records(2, 10, "a")), (True, records(2, 5, "c"))]
    )
    plain = kafka.produce(topic, records(2, 3, "d"))
    want = {(p, o) for p, o in sent[1] + sent[2] + plain}

    open_producer = Producer({**kafka.config(), "transactional.id": f"open-{uuid.uuid4().hex[:8]}"})
    open_producer.init_transactions(30)
    open_producer.begin_transaction()
    pending: list[tuple[int, int]] = []
    for p, key, value in records(2, 4, "e"):
        open_producer.produce(topic, key=key, value=value, partition=p, on_delivery=kafka._acked(pending))
    open_producer.flush(30)
    kafka.produce(topic, records(2, 2, "f"))  # behind the open transaction: not stable yet

    first = job.checkpoint()
    assert {(p, o) for p, o, _, _ in table(tmp_path)} == want, "committed records only, none past the open one"
    assert first.stats["records_in"] == len(want) == 36
    open_producer.commit_transaction(30)
    del open_producer
    second = job.checkpoint()
    got = table(tmp_path)
    assert second.stats["records_in"] == 8 + 4
    assert {u.split("-")[0] for _, _, u, _ in got} == {"a", "c", "d", "e", "f"}, "nothing of the aborted one"
    assert len(got) == len({(p, o) for p, o, _, _ in got}) == 48
    assert not {(p, o) for p, o in sent[0]} & {(p, o) for p, o, _, _ in got}
    assert set(pending) <= {(p, o) for p, o, _, _ in got}
    frame = pd.DataFrame(got, columns=["partition", "offset", "user", "amount"])
    counts = {"a": 10, "c": 5, "d": 3, "e": 4, "f": 2}
    assert frame.groupby("user").size().to_dict() == {f"{t}-{p}": n for t, n in counts.items() for p in range(2)}


def test_partitions_added_between_barriers_are_read_from_their_start_once(spark, kafka, tmp_path):
    """A topic of 2 partitions grows to 4 (Kafka's CreatePartitions) after checkpoint 1, and records land in
    the new partitions before the next barrier sees them: checkpoint 2 reads the new partitions from offset
    0 (none skipped, as Structured Streaming reads partitions it discovers), later ones on from there; each
    produced record is in the table once, at the offset the broker acknowledged."""
    from confluent_kafka.admin import AdminClient, NewPartitions

    topic = f"grow-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 2)
    sent = [(p, o, "a") for p, o in kafka.produce(topic, records(2, 20, "a"))]
    job = make_job(spark, tmp_path, pipeline(topic))
    assert job.checkpoint().stats["records_in"] == 40

    admin = AdminClient(kafka.config())
    admin.create_partitions([NewPartitions(topic, 4)])[topic].result(timeout=30)
    while len(admin.list_topics(topic, timeout=5).topics[topic].partitions) < 4:  # a metadata round trip per poll
        pass
    sent += [(p, o, "b") for p, o in kafka.produce(topic, records(4, 10, "b"))]
    second = job.checkpoint()
    assert second.stats["records_in"] == 40, "10 in each of the 2 old and the 2 new partitions"
    position = second.source_positions["events"]
    assert position["starts"] == {topic: {"2": 0, "3": 0}}, "the new partitions from their first offset"
    assert position["offsets"][topic] == {"0": 30, "1": 30, "2": 10, "3": 10}

    sent += [(p, o, "c") for p, o in kafka.produce(topic, records(4, 5, "c"))]
    third = job.checkpoint()
    assert third.stats["records_in"] == 20 and third.source_positions["events"]["starts"] == {}
    want = sorted((p, o, f"{tag}-{p}", amount) for (p, o, tag), amount in zip(sent, _amounts(2, 20) +
                  _amounts(4, 10) + _amounts(4, 5), strict=True))  # fmt: skip
    assert table(tmp_path) == want, "every record once, the new partitions' first ones included"


def _amounts(partitions: int, each: int) -> list[int]:
    """The ``amount`` of each record of :func:`records`, in produce order."""
    return [i for i in range(each) for _ in range(partitions)]
