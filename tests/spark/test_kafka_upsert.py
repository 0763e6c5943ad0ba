"""Upsert reading (``KafkaSource(upsert=True)``, Flink's ``upsert-kafka``) against Apache Kafka's own broker:
per checkpoint the latest value of each key, a tombstone deleting the key from upsert tables (``delete_when``):
Parquet merged in the driver and by Spark, Delta and PostgreSQL. Ground truth is the produce log replayed in
offset order (what the broker acknowledged); the tables are read back with pyarrow, delta-rs and psycopg."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from airflow_provider_checkpoint.connectors.kafka.source import KafkaSource
from airflow_provider_checkpoint.dataflow import DeltaTableSink, ParquetTableSink, PostgresTableSink
from airflow_provider_checkpoint.testing.inprocess import make_job
from tests.servers.kafka import KafkaBroker
from tests.servers.postgres import PostgresServer
from tests.spark.sink_model import delta_rows

pytestmark = pytest.mark.spark
SINKS = {"in_driver": 250_000, "by_spark": 0}
PG_TABLE = "public.{}"


@pytest.fixture
def kafka(kafka_broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch) -> KafkaBroker:
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_TEST", kafka_broker.uri())
    return kafka_broker


@pytest.fixture
def postgres(postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> PostgresServer:
    monkeypatch.setenv("AIRFLOW_CONN_PG_PLANS", postgres_server.uri())
    return postgres_server


def pipeline(topic: str):
    def declare(tmp: Path) -> None:
        plans = KafkaSource(
            "plans", [topic], kafka_config_id="kafka_test", schema="plan STRING, seats LONG", upsert=True,
            metadata_columns=("key", "offset"),
        )  # fmt: skip
        for name, driver_merge_rows in SINKS.items():
            ParquetTableSink(
                name, plans, str(tmp / name), mode="upsert", keys=["key"], delete_when="tombstone", buckets=3,
                driver_merge_rows=driver_merge_rows,
            )  # fmt: skip
        DeltaTableSink("delta", plans, str(tmp / "delta"), mode="upsert", keys=["key"], delete_when="tombstone")
        PostgresTableSink("pg", plans, "pg_plans", PG_TABLE.format(topic.replace("-", "_")), mode="upsert",
                          keys=["key"], delete_when="tombstone")  # fmt: skip

    return declare


class Changelog:
    """What the test produced, replayed: key → (plan, seats), a tombstone removing the key."""

    def __init__(self, broker: KafkaBroker, topic: str) -> None:
        self.broker, self.topic, self.state = broker, topic, {}

    def send(self, changes: list[tuple[str, tuple[str, int] | None]]) -> None:
        """Each ``(key, value or None)`` to partition ``key's number % 2`` (a key stays in one partition)."""
        records = [
            (int(k[1:]) % 2, k.encode(), None if v is None else json.dumps({"plan": v[0], "seats": v[1]}).encode())
            for k, v in changes
        ]
        acked = self.broker.produce(self.topic, records)
        for _, (key, value) in sorted(zip(acked, changes, strict=True), key=lambda r: r[0]):  # offset order
            if value is None:
                self.state.pop(key, None)
            else:
                self.state[key] = value

    def rows(self) -> list[tuple[bytes, str, int]]:
        return sorted((k.encode(), p, s) for k, (p, s) in self.state.items())


def table(path: Path) -> list[tuple[bytes, str, int]]:
    got = ds.dataset(str(path), format="parquet").to_table()
    assert got.schema.names == ["plan", "seats", "key", "offset"], "the tombstone column is not written"
    return sorted(zip(got["key"].to_pylist(), got["plan"].to_pylist(), got["seats"].to_pylist(), strict=True))


def check(tmp: Path, log: Changelog, topic: str, postgres: PostgresServer) -> None:
    from deltalake import DeltaTable

    for name in SINKS:
        assert table(tmp / name) == log.rows(), name
    columns = [f.name for f in DeltaTable(str(tmp / "delta")).schema().fields]
    assert columns == ["plan", "seats", "key", "offset"], "the tombstone column is not written"
    assert delta_rows(tmp / "delta", ["key", "plan", "seats"]) == log.rows(), "delta (delta-rs scan(), DVs applied)"
    with postgres.connect() as db:
        got = db.execute(f"SELECT key, plan, seats FROM {PG_TABLE.format(topic.replace('-', '_'))}").fetchall()
    assert sorted((bytes(k), p, s) for k, p, s in got) == log.rows(), "postgres"


def test_latest_value_per_key_and_tombstones_delete_the_key(spark, kafka, postgres, tmp_path):
    topic = f"plans-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 2)
    log = Changelog(kafka, topic)
    job = make_job(spark, tmp_path, pipeline(topic))
    # several records of a key in one checkpoint collapse to the last; k3's and k9's tombstones come last
    # (a key never in the table: nothing to delete), k4's tombstone is followed by a new value
    log.send([(f"k{i}", ("free", i)) for i in range(12)])
    log.send([("k1", ("pro", 10)), ("k3", None), ("k4", None), ("k1", ("team", 11)), ("k4", ("pro", 4)), ("k9", None)])
    first = job.checkpoint()
    assert first.stats["records_in"] == 18
    check(tmp_path, log, topic, postgres)
    assert len(log.rows()) == 10

    # deletes of keys in the tables, a re-insert of a deleted key, an update after a tombstone
    log.send([("k0", None), ("k2", None), ("k3", ("back", 3)), ("k5", None), ("k5", ("again", 5)), ("k6", ("pro", 6))])
    job.checkpoint()
    check(tmp_path, log, topic, postgres)

    # every key deleted: each bucket's file emptied
    log.send([(k.decode(), None) for k, _, _ in log.rows()])
    job.checkpoint()
    check(tmp_path, log, topic, postgres)
    assert log.rows() == []
