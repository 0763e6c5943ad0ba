"""KafkaSink against Apache Kafka's own broker: Kafka → Kafka through the real checkpoint protocol.

The ground truth is what the test itself produced to the input topic (user, seq, amount, headers).
The output is read back with a plain ``confluent-kafka`` consumer (not our code), ``read_committed``:
every input record is there exactly once, a key's records in order, across a failed step attempt,
a finalize failing inside the transaction, finalize failing after ``_metadata`` (the next trigger
commits), a finalize process SIGKILLed between produce and commit, a broker restart, a finalize
failing between two sinks' commits, and an explicit re-commit. A restore publishes the replayed
checkpoints again (records cannot be withdrawn): exactly those records are there twice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_checkpoint.connectors.kafka.publish import HISTORY, Publisher
from airflow_provider_checkpoint.connectors.kafka.sink import KafkaSink
from airflow_provider_checkpoint.connectors.kafka.source import KafkaSource
from airflow_provider_checkpoint.dataflow import Transform
from airflow_provider_checkpoint.exceptions import InjectedFault, SinkConnectionError, SinkSchemaError
from airflow_provider_checkpoint.restore.requests import request_restore
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore
from airflow_provider_checkpoint.testing.inprocess import make_job
from tests.servers.kafka import KafkaBroker, consume

pytestmark = pytest.mark.spark
SCHEMA = "user STRING, seq LONG, amount LONG"
CONN = "kafka_sink_test"


@pytest.fixture
def kafka(kafka_broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch) -> KafkaBroker:
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN.upper()}", kafka_broker.uri())
    return kafka_broker


class Input:
    """What the test produced: per user its records in order; user ``u<i>`` always goes to partition ``i % 2``."""

    def __init__(self, broker: KafkaBroker, topic: str) -> None:
        self.broker, self.topic = broker, topic
        self.sent: list[tuple[str, int, int]] = []
        self.seq: Counter[str] = Counter()

    def produce(self, n: int, start: int) -> None:
        from confluent_kafka import Producer

        producer = Producer({**self.broker.config(), "linger.ms": 5})
        for i in range(start, start + n):
            user = f"u{i % 7}"
            seq = self.seq[user]
            self.seq[user] += 1
            amount = 0 if seq % 5 == 4 else i  # every fifth record of a user: a tombstone downstream
            value = json.dumps({"user": user, "seq": seq, "amount": amount}).encode()
            headers = [("origin", f"{user}/{seq}".encode())]
            producer.produce(self.topic, key=user.encode(), value=value, headers=headers, partition=int(user[1:]) % 2)
            self.sent.append((user, seq, amount))
        assert producer.flush(30) == 0


def pipeline(in_topic: str, json_topic: str, raw_topic: str) -> Any:
    def declare(base: Path) -> None:
        from pyspark.sql import functions as F

        source = KafkaSource(
            "in", [in_topic], kafka_config_id=CONN, schema=SCHEMA, metadata_columns=("headers", "partition")
        )
        shaped = Transform(
            "shaped",
            source,
            lambda df: (
                df.withColumn("gone", F.col("amount") == 0)
                .withColumn("line", F.concat_ws(":", "user", F.col("seq").cast("string")))
                .withColumn("p", (F.col("seq") % 3).cast("int"))
            ),
        )
        KafkaSink(
            "json_out", shaped, json_topic, CONN, key="user", value_columns=["user", "seq", "amount"],
            tombstone_column="gone", headers_column="headers", step="publish",
        )  # fmt: skip
        KafkaSink(
            "raw_out", shaped, raw_topic, CONN, format="raw", value_column="line", partition_column="p", step="publish"
        )

    return declare


def check_json(records: list[Any], sent: list[tuple[str, int, int]], twice: set[tuple[str, int]] = frozenset()) -> None:
    """Each sent record once (those in ``twice`` twice), a key's in order, values, tombstones and headers as sent."""
    by_user: dict[str, list[int]] = defaultdict(list)
    partitions: dict[str, set[int]] = defaultdict(set)
    for m in records:
        user = m.key().decode()
        partitions[user].add(m.partition())
        (name, origin), *_ = m.headers()
        seq = int(origin.decode().split("/")[1])
        assert (name, origin.decode()) == ("origin", f"{user}/{seq}")
        amount = dict(((u, s), a) for u, s, a in sent)[(user, seq)]
        if amount == 0:
            assert m.value() is None, "a tombstone"
        else:
            assert json.loads(m.value()) == {"user": user, "seq": seq, "amount": amount}
        by_user[user].append(seq)
    expected: dict[str, list[int]] = defaultdict(list)
    for user, seq, _ in sent:
        expected[user].append(seq)
    for user in expected:
        once = expected[user]
        again = [s for s in once if (user, s) in twice]
        assert by_user[user] == once + again, f"{user}: {by_user[user]} != {once} + {again}"
        assert len(partitions[user]) == 1, "one key, one partition (the key hash)"
    assert set(by_user) == set(expected)


def sink(job: Any, uid: str) -> KafkaSink:
    found = next(s for s in job.graph.sinks if s.uid == uid)
    assert isinstance(found, KafkaSink)
    return found


def commit_in_subprocess(
    tmp: Path, topic: str, committables: list[Any], checkpoint_id: int, env: dict[str, str]
) -> int:
    """Finalize's commit of sink ``json_out`` in a new process, killed (SIGKILL) between produce and commit."""
    script = """
import json, sys
from airflow_provider_checkpoint.connectors.kafka.sink import KafkaSink
from airflow_provider_checkpoint.dataflow.graph import Node
from airflow_provider_checkpoint.storage import JobStorage
root, topic, conn, checkpoint, committables = sys.argv[1:]
sink = KafkaSink("json_out", Node("in", []), topic, conn, key="user")
sink.bind_job("multi")
sink.bind_storage(JobStorage.for_job(root, "multi"))
sink.commit(int(checkpoint), json.loads(committables))
"""
    fault = f"finalize.inside_sink_commit:checkpoint={checkpoint_id}:action=kill"
    done = subprocess.run(
        [sys.executable, "-c", script, f"file://{tmp}/ckpt", topic, CONN, str(checkpoint_id), json.dumps(committables)],
        env={**env, "CHECKPOINT_FAULTS": fault}, capture_output=True, timeout=120,
    )  # fmt: skip
    return done.returncode


def test_every_fault_publishes_each_record_once_and_a_restore_republishes_the_replay(
    spark, kafka, tmp_path, monkeypatch
):
    in_topic, json_topic, raw_topic = (f"{n}-{uuid.uuid4().hex[:8]}" for n in ("in", "json", "raw"))
    kafka.create_topic(in_topic, 2)
    kafka.create_topic(json_topic, 3)
    kafka.create_topic(raw_topic, 3)
    data = Input(kafka, in_topic)
    job = make_job(spark, tmp_path, pipeline(in_topic, json_topic, raw_topic))
    store = CompletedCheckpointStore(job.storage)

    def run(n: int, fault: str | None = None) -> None:
        data.produce(n, len(data.sent))
        if fault:
            monkeypatch.setenv("CHECKPOINT_FAULTS", fault)
        else:
            monkeypatch.delenv("CHECKPOINT_FAULTS", raising=False)
        try:
            job.checkpoint()
        except InjectedFault:
            assert fault and fault.startswith("finalize."), f"only finalize faults end a checkpoint run: {fault}"

    run(20)
    run(15, "step.before_ack:checkpoint=2:attempt=1")  # the step's first attempt staged, then failed
    run(12, "finalize.inside_sink_commit:checkpoint=3:sink=json_out")  # produced, then aborted
    run(9, "finalize.after_metadata:checkpoint=4")  # completed, not published: the next trigger commits
    four = store.load(4)
    env = {k: v for k, v in os.environ.items() if k != "CHECKPOINT_FAULTS"}
    assert commit_in_subprocess(tmp_path, json_topic, four.sinks["json_out"], 4, env) == -9
    kafka.restart()  # the killed producer's transaction is still open on the restarted broker
    run(11, "finalize.between_sink_commits:checkpoint=5:sink=json_out")  # json_out published, raw_out not
    run(8)
    six = store.load(6)
    job.coordinator.sink_committer.commit(six)  # an explicit re-commit publishes nothing

    committed = consume(kafka, json_topic, "read_committed")
    check_json(committed, data.sent)
    assert len(consume(kafka, json_topic, "read_uncommitted")) > len(committed), "read_uncommitted sees aborted ones"
    raw = consume(kafka, raw_topic, "read_committed")
    assert sorted(m.value().decode() for m in raw) == sorted(f"{u}:{s}" for u, s, _ in data.sent)
    assert all(m.partition() == int(m.value().decode().split(":")[1]) % 3 for m in raw)
    assert sink(job, "json_out").published_marker().latest() == 6

    # a restore to checkpoint 4 replays 5 and 6 under new ids: published again, as Flink's KafkaSink does
    replayed = {(u, s) for u, s, _ in data.sent[20 + 15 + 12 + 9 :]}
    request_restore(job.storage, job.storage.url("chk-4"), False, False)
    run(0)
    check_json(consume(kafka, json_topic, "read_committed"), data.sent, twice=replayed)


def test_a_reused_id_is_published_and_a_timeout_beyond_the_broker_limit_is_refused(spark, kafka, tmp_path):
    """A job whose storage was lost starts its ids at 1 again: its checkpoint 1 has another token, so it is
    published, not taken for the old checkpoint 1. A missing topic fails the step; a transaction timeout over the
    broker's limit is a clear error."""
    in_topic, json_topic, raw_topic = (f"{n}-{uuid.uuid4().hex[:8]}" for n in ("in", "json", "raw"))
    kafka.create_topic(in_topic, 2)
    for topic in (json_topic, raw_topic):
        kafka.create_topic(topic, 3)
    data = Input(kafka, in_topic)
    data.produce(10, 0)
    make_job(spark, tmp_path / "first", pipeline(in_topic, json_topic, raw_topic)).checkpoint()
    again = make_job(spark, tmp_path / "again", pipeline(in_topic, json_topic, raw_topic))
    assert again.checkpoint().checkpoint_id == 1
    check_json(consume(kafka, json_topic, "read_committed"), data.sent, twice={(u, s) for u, s, _ in data.sent})
    marker = sink(again, "json_out").published_marker()
    assert [i for i, _ in marker.history] == [1, 1] and len(set(marker.history)) == 2 and HISTORY >= 2

    missing = make_job(spark, tmp_path / "missing", pipeline(in_topic, "no-such-topic", raw_topic))
    with pytest.raises(SinkConnectionError, match="no-such-topic do not exist"):  # in the step, before _metadata
        missing.checkpoint()
    assert CompletedCheckpointStore(missing.storage).completed_ids() == []

    publisher = Publisher(kafka.config(), CONN, f"t-{uuid.uuid4().hex}", json_topic, 900_001)
    with pytest.raises(SinkConnectionError, match=r"transaction\.max\.timeout\.ms"):
        publisher.__enter__()


def test_a_record_the_topic_would_refuse_fails_the_step_and_nothing_is_published(spark, kafka, tmp_path):
    """The topic's ``max.message.bytes`` (2,000 here) is asked in the step: a checkpoint with one record over
    it is refused there, naming the limit, before ``_metadata``; nothing reaches the topic."""
    in_topic, out_topic = (f"{n}-{uuid.uuid4().hex[:8]}" for n in ("in", "small"))
    kafka.create_topic(in_topic, 2)
    kafka.create_topic(out_topic, 1, {"max.message.bytes": "2000"})
    Input(kafka, in_topic).produce(7, 0)

    def declare(base: Path) -> None:
        from pyspark.sql import functions as F

        source = KafkaSource("in", [in_topic], kafka_config_id=CONN, schema=SCHEMA)
        size = F.when(F.col("user") == "u3", 2_500).otherwise(10)  # one record over the limit
        big = Transform("big", source, lambda df: df.withColumn("line", F.repeat(F.lit("x"), size)))
        KafkaSink("out", big, out_topic, CONN, format="raw", value_column="line")

    job = make_job(spark, tmp_path / "job", declare)
    with pytest.raises(SinkSchemaError, match=rf"larger than 2,000 bytes.*topic {out_topic}'s max.message.bytes"):
        job.checkpoint()
    assert CompletedCheckpointStore(job.storage).completed_ids() == []
    assert consume(kafka, out_topic, "read_uncommitted") == []


def test_a_file_source_read_once_by_the_sink_refuses_a_malformed_record_and_publishes_nothing(spark, kafka, tmp_path):
    """A file source feeding only a Kafka sink is read in the sink's one pass (:attr:`Sink.reads_input_once`):
    its count comes from that pass, and a malformed record still fails the step before ``_metadata``, with
    nothing published; the next checkpoint publishes exactly the good records, once."""
    from airflow_provider_checkpoint.connectors.files.source import FileSource
    from airflow_provider_checkpoint.exceptions import MalformedInputError
    from airflow_provider_checkpoint.storage.job_records import JobRecordStore

    out_topic = f"lines-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(out_topic, 1)
    landing = tmp_path / "landing"
    landing.mkdir()

    def declare(base: Path) -> None:
        source = FileSource("lines", str(landing), "json", "user STRING, seq LONG")
        KafkaSink("out", source, out_topic, CONN, key="user", value_columns=["user", "seq"])

    def land(name: str, rows: list[tuple[str, int]], extra: str = "") -> None:
        (landing / name).write_text("".join(json.dumps({"user": u, "seq": s}) + "\n" for u, s in rows) + extra)

    job = make_job(spark, tmp_path / "job", declare)
    land("a.json", [("u1", 1), ("u2", 1)])
    assert job.checkpoint().stats["records_in"] == 2
    land("b.json", [("u1", 2)], '{"user": "u3", "seq": "not a number"}\n')
    with pytest.raises(MalformedInputError, match=r"b[.]json line 2"):
        job.checkpoint()
    assert [json.loads(m.value()) for m in consume(kafka, out_topic, "read_uncommitted")] == [
        {"user": "u1", "seq": 1},
        {"user": "u2", "seq": 1},
    ], "the failed checkpoint published nothing"
    JobRecordStore(job.storage).release_lease(f"run-{job.checkpoints}")  # as the failed run's finalize does
    land("b.json", [("u1", 2)])
    assert job.checkpoint().stats["records_in"] == 1
    got = sorted((m.key().decode(), json.loads(m.value())["seq"]) for m in consume(kafka, out_topic, "read_committed"))
    assert got == [("u1", 1), ("u1", 2), ("u2", 1)]
