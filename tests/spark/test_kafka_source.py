"""KafkaSource against Apache Kafka's own broker on 127.0.0.1 (Tansu for a broker refusing every SASL
login), through an Airflow connection.

Every record the test produced reaches an append table exactly once (checked by topic,
partition and offset against the produce log, read back with pyarrow), and an upsert table
of per-user totals equals pandas over the same records: across checkpoints, a bounded
backlog, a new topic matching the pattern, a restore that replays, and a malformed value.
"""

from __future__ import annotations

import json
import random
import re
import time
import uuid
from pathlib import Path

import pandas as pd
import pyarrow.dataset as ds
import pytest

from airflow_provider_checkpoint.connectors.kafka import client
from airflow_provider_checkpoint.connectors.kafka.offsets import Offsets
from airflow_provider_checkpoint.connectors.kafka.source import KafkaSource
from airflow_provider_checkpoint.dataflow import KeyedAggregate, ParquetTableSink
from airflow_provider_checkpoint.exceptions import KafkaSourceError, MalformedInputError, raised_in_spark
from airflow_provider_checkpoint.restore.requests import request_restore
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore
from airflow_provider_checkpoint.testing.inprocess import make_job
from tests.servers.kafka import KafkaBroker, Tansu

pytestmark = pytest.mark.spark
SCHEMA = "user STRING, amount LONG"


@pytest.fixture
def kafka(kafka_broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch) -> KafkaBroker:
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_TEST", kafka_broker.uri())
    return kafka_broker


class Produced:
    """What the test produced: ``(topic, partition, offset) -> (user, amount)``, offsets as the broker gave them."""

    def __init__(self, broker: KafkaBroker, seed: int) -> None:
        self.broker, self.rng, self.records = broker, random.Random(seed), {}
        self.next: dict[tuple[str, int], int] = {}

    def produce(self, topic: str, partitions: int, n: int) -> None:
        batch = []
        for _ in range(n):
            partition = self.rng.randrange(partitions)
            user, amount = f"u{self.rng.randrange(30)}", self.rng.randrange(1000)
            offset = self.next.get((topic, partition), 0)
            self.next[(topic, partition)] = offset + 1
            self.records[(topic, partition, offset)] = (user, amount)
            batch.append((partition, user.encode(), json.dumps({"user": user, "amount": amount}).encode()))
        self.broker.produce(topic, batch)

    def frame(self) -> pd.DataFrame:
        rows = [(t, p, o, u, a) for (t, p, o), (u, a) in self.records.items()]
        return pd.DataFrame(rows, columns=["topic", "partition", "offset", "user", "amount"])


def pipeline(topics: list[str] | None = None, pattern: str | None = None, **options):
    def declare(tmp: Path) -> None:
        events = KafkaSource("events", topics, pattern=pattern, kafka_config_id="kafka_test", schema=SCHEMA, **options)
        totals = KeyedAggregate("totals", events, keys=["user"], aggs={"n": "count", "total": "sum(amount)"})
        ParquetTableSink("totals_table", totals, str(tmp / "totals"), mode="upsert", keys=["user"])
        ParquetTableSink("events_table", events, str(tmp / "events"), mode="append")

    return declare


def table(path: Path) -> pd.DataFrame:
    return ds.dataset(str(path), format="parquet").to_table().to_pandas()


def check(tmp: Path, produced: pd.DataFrame) -> None:
    """The append table holds each produced record once; the totals equal pandas over them."""
    got = table(tmp / "events")
    key = ["topic", "partition", "offset"]
    assert not got.duplicated(key).any(), "a record reached the table twice"
    merged = got[[*key, "user", "amount"]].merge(produced, on=key, how="outer", suffixes=("", "_sent"), indicator=True)
    assert (merged["_merge"] == "both").all(), merged[merged["_merge"] != "both"].head()
    assert (merged["user"] == merged["user_sent"]).all() and (merged["amount"] == merged["amount_sent"]).all()
    want = produced.groupby("user").agg(n=("amount", "size"), total=("amount", "sum")).reset_index()
    totals = table(tmp / "totals")[["user", "n", "total"]].sort_values("user").reset_index(drop=True)
    pd.testing.assert_frame_equal(totals, want.sort_values("user").reset_index(drop=True), check_dtype=False)


def test_each_record_exactly_once_across_backlog_new_topics_and_a_restore(spark, kafka, tmp_path):
    prefix = f"evt-{uuid.uuid4().hex[:8]}"
    first, second = f"{prefix}-a", f"{prefix}-b"
    kafka.create_topic(first, 4)
    produced = Produced(kafka, seed=7)
    produced.produce(first, 4, 700)
    job = make_job(spark, tmp_path, pipeline(pattern=rf"{prefix}-.*", max_records_per_checkpoint=500))

    one = job.checkpoint()  # a backlog of 700: at most 500 in one checkpoint
    assert one.stats["records_in"] == 500
    two = job.checkpoint()
    assert two.stats["records_in"] == 200
    check(tmp_path, produced.frame())

    kafka.create_topic(second, 2)  # a topic that starts to match joins from its earliest offset
    produced.produce(second, 2, 150)
    produced.produce(first, 4, 120)
    three = job.checkpoint()
    assert three.stats["records_in"] == 270
    check(tmp_path, produced.frame())
    ends = {
        (t, int(p)): o for t, parts in three.source_positions["events"]["offsets"].items() for p, o in parts.items()
    }
    assert ends == {(t, p): n for (t, p), n in produced.next.items()} | {
        (first, p): ends[(first, p)] for p in range(4) if (first, p) not in produced.next
    }
    group = client.committed(kafka.config(), "airflow-checkpoint-events", sorted(ends))
    assert group == {tp: o for tp, o in ends.items() if o > 0}, "the completed checkpoint's offsets, for lag tools"

    request_restore(job.storage, job.storage.url("chk-2"), False, False)  # replay checkpoint 3's records
    produced.produce(first, 4, 40)
    four = job.checkpoint()
    assert four.restored_from == 2 and four.stats["records_in"] == 310
    check(tmp_path, produced.frame())
    assert CompletedCheckpointStore(job.storage).completed_ids()[-1] == 4


def test_latest_starts_at_the_end_and_a_malformed_value_commits_nothing(spark, kafka, tmp_path):
    topic = f"evt-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 2)
    produced = Produced(kafka, seed=3)
    produced.produce(topic, 2, 50)
    job = make_job(spark, tmp_path, pipeline([topic], starting_offsets="latest"))
    assert job.checkpoint().stats["records_in"] == 0, "latest: what was there before the first barrier is skipped"
    produced.records.clear()  # the records before the first barrier are not expected anywhere
    produced.produce(topic, 2, 60)
    assert job.checkpoint().stats["records_in"] == 60
    check(tmp_path, produced.frame())

    good, bad, tombstone = (b"u1", b'{"user": "u1", "amount": 5}'), (b"u1", b"{not json"), (b"u2", None)
    kafka.produce(topic, [(1, *good), (1, *bad), (0, *tombstone)])
    outputs = {p: p.read_bytes() for p in tmp_path.rglob("*.parquet")}
    first = rf"{topic}\[0\] offset \d+: a tombstone \(null value\), not a record"
    named = rf"{first}\n  {topic}\[1\] offset \d+: '{{not json'"
    with pytest.raises(MalformedInputError, match=rf"(?s)2 of 3 record\(s\) are malformed json .*{named}"):
        job.checkpoint()
    assert CompletedCheckpointStore(job.storage).completed_ids() == [1, 2], "nothing of that checkpoint committed"
    assert {p: p.read_bytes() for p in tmp_path.rglob("*.parquet")} == outputs


def test_a_missing_topic_and_an_unreachable_broker_are_named(spark, kafka, tmp_path, monkeypatch):
    job = make_job(spark, tmp_path, pipeline(["no-such-topic"]))
    with pytest.raises(KafkaSourceError, match=r"Kafka topic\(s\) no-such-topic do not exist on 127\.0\.0\.1:\d+"):
        job.checkpoint()
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_TEST", json.dumps({"conn_type": "kafka", "extra": {}}))
    with pytest.raises(KafkaSourceError, match="Kafka connection 'kafka_test': its extra must be a JSON object"):
        client.connection_config("kafka_test")


def test_wrong_credentials_are_refused_at_once_and_commit_nothing(spark, kafka, tmp_path, monkeypatch):
    """A broker requiring SASL refuses the connection's login (Tansu refuses every login: see
    tests/servers/kafka.py) at the trigger, and later (the trigger's connection right) at the step: each
    a refusal naming the connection and the address, never the password, within seconds, committing
    nothing. Between them the same job, its connection fixed (the broker holding the records; Tansu
    accepts no login), reads every record once."""
    from airflow_provider_checkpoint.spark.acks import decline_for
    from tests.servers.s3 import free_ports

    topic, group = f"evt-{uuid.uuid4().hex[:8]}", "airflow-checkpoint-events"
    kafka.create_topic(topic, 2)
    produced = Produced(kafka, seed=51)
    produced.produce(topic, 2, 60)
    guarded = Tansu(free_ports(1)[0], tmp_path / "tansu-auth.log", authentication=True)
    guarded.start()
    password = f"hunter2-{uuid.uuid4().hex}"
    wrong = guarded.uri(guarded.sasl_config("etl", password))
    refused = rf"Kafka connection 'kafka_test': the broker {re.escape(guarded.servers)} refused the credentials"

    def outputs() -> dict[Path, bytes]:
        return {p: p.read_bytes() for table in ("events", "totals") for p in (tmp_path / table).rglob("*.parquet")}

    try:
        monkeypatch.setenv("AIRFLOW_CONN_KAFKA_TEST", wrong)
        job = make_job(spark, tmp_path, pipeline([topic]))
        started = time.monotonic()
        with pytest.raises(KafkaSourceError, match=refused) as at_trigger:
            job.checkpoint()
        assert time.monotonic() - started < 15, "refused at once, not after the 30 s timeout"
        assert password not in str(at_trigger.value)
        assert CompletedCheckpointStore(job.storage).completed_ids() == [] and outputs() == {}
        assert client.committed(kafka.config(), group, [(topic, 0), (topic, 1)]) == {}, "no group commit"

        monkeypatch.setenv("AIRFLOW_CONN_KAFKA_TEST", kafka.uri())
        assert job.checkpoint().stats["records_in"] == 60
        check(tmp_path, produced.frame())
        ends = dict(produced.next)
        assert client.committed(kafka.config(), group, sorted(ends)) == ends

        produced.produce(topic, 2, 30)
        before, completed = outputs(), CompletedCheckpointStore(job.storage).completed_ids()
        assert before and completed
        started = time.monotonic()
        with pytest.raises(Exception) as at_step:  # the barrier is cut, then the step's login is wrong
            job.checkpoint(during=lambda: monkeypatch.setenv("AIRFLOW_CONN_KAFKA_TEST", wrong))
        assert time.monotonic() - started < 30, "refused at once, not after the reader's idle timeout"
        step_refusal = raised_in_spark(at_step.value)
        assert isinstance(step_refusal, KafkaSourceError) and re.search(refused, str(step_refusal)), at_step.value
        assert decline_for(at_step.value).fatal, "a refusal: the step is not retried"
        assert password not in str(at_step.value)
        assert CompletedCheckpointStore(job.storage).completed_ids() == completed and outputs() == before
        assert client.committed(kafka.config(), group, sorted(ends)) == ends, "no group commit"
    finally:
        guarded.stop()


def test_malformed_values_go_to_dead_letters_exactly_once(spark, kafka, tmp_path):
    """Values that do not parse, and values that are no JSON text at all (a tombstone, an empty value,
    bytes not UTF-8 inside a JSON string), are dead letters naming why, never rows."""
    topic = f"evt-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 2)
    produced = Produced(kafka, seed=11)
    produced.produce(topic, 2, 80)
    bad = [
        (0, b"u1", b"{not json", "{not json", "not valid JSON"),
        (1, b"u2", b'{"user": "u2", "amount": "many"}', '{"user": "u2", "amount": "many"}', "does not match"),
        (0, b"u3", None, None, "a tombstone (null value), not a record"),
        (1, b"u4", b"", "", "an empty value, not a record"),
        (0, b"u5", b'{"user": "u5\xff", "amount": 5}', '{"user": "u5\ufffd", "amount": 5}', "not valid UTF-8"),
    ]
    at = kafka.produce(topic, [(p, k, v) for p, k, v, _, _ in bad])
    job = make_job(
        spark, tmp_path, pipeline([topic], on_malformed="dead_letter", dead_letter_path=str(tmp_path / "dlq"))
    )
    done = job.checkpoint()
    assert (done.stats["records_in"], done.stats["malformed_records"]) == (80, 5)
    check(tmp_path, produced.frame())
    letters = table(tmp_path / "dlq").sort_values(["file", "line"]).reset_index(drop=True)
    want = sorted((f"{topic}[{p}]", o, raw, why) for (p, o), (_, _, _, raw, why) in zip(at, bad, strict=True))
    assert letters[["source", "file", "line", "raw", "checkpoint_id"]].values.tolist() == [
        ["events", file, line, raw, 1] for file, line, raw, _ in want
    ]
    for error, (_, _, _, why) in zip(letters["error"], want, strict=True):
        assert error.startswith(why), (error, why)
    assert job.checkpoint().stats["records_in"] == 0 and len(table(tmp_path / "dlq")) == 5, "each dead letter once"

    def raw(tmp: Path) -> None:  # the same topic as bytes: every value a row, as produced
        source = KafkaSource(
            "raw", [topic], kafka_config_id="kafka_test", format="raw", metadata_columns=["partition", "offset"]
        )
        ParquetTableSink("values", source, str(tmp / "values"), mode="append")

    assert make_job(spark, tmp_path / "raw", raw).checkpoint().stats["records_in"] == 85
    values = table(tmp_path / "raw" / "values")
    got = {(p, o): v for p, o, v in zip(values["partition"], values["offset"], values["value"], strict=True)}
    assert len(got) == len(values) == 85
    assert [got[position] for position in at] == [v for _, _, v, _, _ in bad], "null, empty and bytes as sent"


def test_kafka_and_files_in_one_barrier(spark, kafka, tmp_path):
    from airflow_provider_checkpoint.dataflow import FileSource, Union

    topic = f"evt-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 2)
    landing = tmp_path / "landing"
    landing.mkdir()

    def declare(tmp: Path) -> None:
        streamed = KafkaSource("streamed", [topic], kafka_config_id="kafka_test", schema=SCHEMA, metadata_columns=())
        landed = FileSource("landed", str(landing), "json", SCHEMA)
        both = Union("both", [streamed, landed])
        totals = KeyedAggregate("totals", both, keys=["user"], aggs={"n": "count", "total": "sum(amount)"})
        ParquetTableSink("totals_table", totals, str(tmp / "totals"), mode="upsert", keys=["user"])

    job = make_job(spark, tmp_path, declare)
    produced, files = Produced(kafka, seed=5), []
    for n in range(1, 4):
        produced.produce(topic, 2, 40 * n)
        rows = [{"user": f"u{(n * 7 + i) % 30}", "amount": i} for i in range(25)]
        (landing / f"f{n}.json").write_text("\n".join(json.dumps(r) for r in rows))
        files += rows
        done = job.checkpoint()
        assert set(done.source_positions) == {"streamed", "landed"}, "one barrier across both sources"
        assert done.stats["records_in"] == 40 * n + 25
    events = pd.concat([produced.frame()[["user", "amount"]], pd.DataFrame(files)], ignore_index=True)
    want = events.groupby("user").agg(n=("amount", "size"), total=("amount", "sum")).reset_index()
    got = table(tmp_path / "totals")[["user", "n", "total"]].sort_values("user").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want.sort_values("user").reset_index(drop=True), check_dtype=False)


def test_faults_and_a_broker_restart_lose_and_duplicate_nothing(spark, kafka, tmp_path, monkeypatch):
    """The broker is restarted between checkpoints (its log on disk survives); a step attempt fails after
    staging, a finalize dies after ``_metadata``."""
    topic = f"evt-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 3)
    produced = Produced(kafka, seed=21)
    job = make_job(spark, tmp_path, pipeline([topic]))
    produced.produce(topic, 3, 200)
    monkeypatch.setenv("CHECKPOINT_FAULTS", "step.before_ack:checkpoint=1:attempt=1")
    job.checkpoint()  # the step's first attempt staged, then failed: the retry reads the same range
    attempts: dict[str, list[int]] = {}
    for step, attempt in [(s, a) for cid, s, a in job.step_runs if cid == 1]:
        attempts.setdefault(step, []).append(attempt)
    assert attempts and all(a == [1, 2] for a in attempts.values()), attempts
    check(tmp_path, produced.frame())

    kafka.restart()
    produced.produce(topic, 3, 150)
    monkeypatch.setenv("CHECKPOINT_FAULTS", "finalize.after_metadata:checkpoint=2")
    with pytest.raises(Exception, match="finalize.after_metadata"):
        job.checkpoint()
    monkeypatch.delenv("CHECKPOINT_FAULTS")
    produced.produce(topic, 3, 50)
    assert job.checkpoint().stats["records_in"] == 50, "the trigger finished checkpoint 2's commit first"
    check(tmp_path, produced.frame())


def test_a_source_read_once_by_its_aggregate_counts_and_refuses_as_a_cached_read_does(spark, kafka, tmp_path):
    """The source's only consumer reads it once (uncached, counted on the aggregate's pass): the counts are
    exact, and a value whose field no operator uses still fails to parse, naming its offset."""
    topic = f"evt-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 2)
    produced = Produced(kafka, seed=5)

    def declare(tmp: Path) -> None:
        events = KafkaSource("events", [topic], kafka_config_id="kafka_test", schema=f"{SCHEMA}, ts LONG")
        totals = KeyedAggregate("totals", events, keys=["user"], aggs={"n": "count", "total": "sum(amount)"})
        ParquetTableSink("totals_table", totals, str(tmp / "totals"), mode="upsert", keys=["user"])

    job = make_job(spark, tmp_path, declare)
    for n in (80, 45):
        produced.produce(topic, 2, n)
        done = job.checkpoint()
        assert done.stats["records_in"] == n
        assert [m["source_records"] for m in done.stats["steps"].values()] == [{"events": n}]
        want = produced.frame().groupby("user").agg(n=("amount", "size"), total=("amount", "sum")).reset_index()
        got = table(tmp_path / "totals")[["user", "n", "total"]].sort_values("user").reset_index(drop=True)
        pd.testing.assert_frame_equal(got, want.sort_values("user").reset_index(drop=True), check_dtype=False)

    kafka.produce(topic, [(0, b"u1", b'{"user": "u1", "amount": 5, "ts": "soon"}')])  # ts: used by no operator
    outputs = {p: p.read_bytes() for p in tmp_path.rglob("*.parquet")}
    with pytest.raises(MalformedInputError, match=rf"1 of 1 record\(s\) are malformed json .*\n  {topic}\[0\] offset"):
        job.checkpoint()
    assert CompletedCheckpointStore(job.storage).completed_ids() == [1, 2], "nothing of that checkpoint committed"
    assert {p: p.read_bytes() for p in tmp_path.rglob("*.parquet")} == outputs


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_records_deleted_before_the_step_reads_them_are_detected(spark, kafka, tmp_path, fail_on_data_loss):
    """The first 50 records of the barrier's range deleted (``DeleteRecords``, what retention does too)
    after the barrier is cut, before the step reads them."""
    from confluent_kafka import TopicPartition as KafkaPartition
    from confluent_kafka.admin import AdminClient

    topic = f"evt-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 1)
    produced = Produced(kafka, seed=31)
    produced.produce(topic, 1, 120)
    job = make_job(spark, tmp_path, pipeline([topic], fail_on_data_loss=fail_on_data_loss))

    def delete_the_first_50() -> None:
        admin = AdminClient(kafka.config())  # held until the answer: its destruction fails the future
        (done,) = admin.delete_records([KafkaPartition(topic, 0, 50)]).values()
        assert done.result(timeout=30).low_watermark == 50  # the new log start

    if fail_on_data_loss:
        with pytest.raises(Exception) as raised:
            job.checkpoint(during=delete_the_first_50)
        refused = raised_in_spark(raised.value)
        assert refused is not None and re.search(
            rf"Kafka records lost: 50 record\(s\) of {topic}\[0\] offsets \[0, 120\) are gone", str(refused)
        ), raised.value
        assert CompletedCheckpointStore(job.storage).completed_ids() == []
    else:
        done = job.checkpoint(during=delete_the_first_50)
        kept = table(tmp_path / "events")
        lost = {m["source_lost"]["events"] for m in done.stats["steps"].values() if "source_lost" in m}
        assert lost == {50} and sorted(kept["offset"]) == list(range(50, 120)), "the later records, each once"


def test_a_savepoint_restores_the_offsets_it_was_taken_at_rescaled(spark, kafka, tmp_path):
    """Restored from a savepoint with another parallelism (shuffle partitions, and ranges split over
    more read tasks): the job replays from the savepoint's offsets, its keyed state rescaled."""
    topic = f"evt-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 3)
    produced = Produced(kafka, seed=41)
    job = make_job(spark, tmp_path, pipeline([topic]))
    produced.produce(topic, 3, 90)
    savepoint = tmp_path / "savepoints" / "sp-1"
    taken = job.checkpoint(savepoint_target=f"file://{savepoint}")
    produced.produce(topic, 3, 60)
    job.checkpoint()
    request_restore(job.storage, f"file://{savepoint}", False, False)  # back to the savepoint's offsets
    produced.produce(topic, 3, 30)
    previous = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "3")
    try:
        rescaled = make_job(spark, tmp_path, pipeline([topic], min_partitions=7))
        restored = rescaled.checkpoint()
        produced.produce(topic, 3, 25)
        assert rescaled.checkpoint().stats["records_in"] == 25
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", previous)
    assert restored.stats["records_in"] == 90, "the 60 after the savepoint again, and the 30 new ones"
    assert restored.stats["restored_from_url"] == f"file://{savepoint}"
    read = Offsets.parse(restored.source_positions["events"]).ranges(Offsets.parse(taken.source_positions["events"]))
    assert sum(end - start for _, start, end in read) == 90, "read from the savepoint's offsets"
    check(tmp_path, produced.frame())
