"""The Kafka → Kafka example (``dags/example_kafka_to_kafka.py``) through real Airflow (``dag.test()``),
real Spark and Apache Kafka's broker, the connection given as a user gives it.

The first run's finalize fails inside the totals sink's transaction, after the enriched sink committed
(the run fails); the second run's trigger publishes the totals of checkpoint 1 (the enriched output is
not published again) and then checkpoint 2. A plain ``read_committed`` consumer then sees every order
once, enriched, with its headers, and the latest total of each user equals pandas over the orders.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pandas as pd
import pytest

from airflow_provider_checkpoint.jobs.audit import audit_job
from airflow_provider_checkpoint.storage import JobStorage
from tests.airflow.conftest import load_dag_module
from tests.conftest import REPO
from tests.servers.kafka import consume

pytestmark = pytest.mark.airflow


@pytest.fixture
def example(airflow_db, kafka_broker, tmp_path, monkeypatch) -> Iterator[ModuleType]:
    for name in ("ORDERS_TOPIC", "ENRICHED_TOPIC", "TOTALS_TOPIC"):
        topic = f"{name.split('_')[0].lower()}-{uuid.uuid4().hex[:8]}"
        kafka_broker.create_topic(topic, 2)
        monkeypatch.setenv(name, topic)
    monkeypatch.setenv("AIRFLOW_CONN_ORDERS_KAFKA", kafka_broker.uri())
    monkeypatch.setenv("AIRFLOW__CHECKPOINT__STORAGE_ROOT", f"file://{tmp_path}/checkpoints")
    monkeypatch.delenv("CHECKPOINT_FAULTS", raising=False)
    yield load_dag_module(REPO / "dags" / "example_kafka_to_kafka.py")


def produce(broker, topic: str, start: int, n: int) -> list[dict]:
    rng = random.Random(start)
    rows = [{"order_id": start + i, "user": f"u{rng.randrange(12)}", "amount": rng.randrange(200)} for i in range(n)]
    from confluent_kafka import Producer

    producer = Producer(broker.config())
    for r in rows:
        headers = [("order", str(r["order_id"]).encode())]
        producer.produce(topic, key=r["user"].encode(), value=json.dumps(r).encode(), headers=headers)
    assert producer.flush(30) == 0
    return rows


def test_example_kafka_to_kafka_exactly_once(example, kafka_broker, monkeypatch, tmp_path):
    dag = example.dag
    orders = produce(kafka_broker, example.ORDERS, 0, 150)
    monkeypatch.setenv("CHECKPOINT_FAULTS", "finalize.inside_sink_commit:checkpoint=1:sink=totals_out")
    assert dag.test().state == "failed"
    monkeypatch.delenv("CHECKPOINT_FAULTS")
    orders += produce(kafka_broker, example.ORDERS, 150, 80)
    assert dag.test().state == "success"

    enriched = consume(kafka_broker, example.ENRICHED, "read_committed")
    got = sorted(json.loads(m.value())["order_id"] for m in enriched)
    assert got == [o["order_id"] for o in orders], "every order once"
    for m in enriched:
        value = json.loads(m.value())
        assert m.key().decode() == value["user"] and value["big"] == (value["amount"] >= 100)
        assert m.headers() == [("order", str(value["order_id"]).encode())]

    latest = {}
    for m in consume(kafka_broker, example.TOTALS, "read_committed"):  # one partition per key: in order
        latest[m.key().decode()] = json.loads(m.value())
    want = (
        pd.DataFrame(orders)
        .groupby("user")
        .agg(orders=("amount", "size"), spent=("amount", "sum"), biggest=("amount", "max"))
    )
    assert {u: (v["orders"], v["spent"], v["biggest"]) for u, v in latest.items()} == {
        u: (int(r.orders), int(r.spent), int(r.biggest)) for u, r in want.iterrows()
    }
    # the staged record files are kept with their checkpoints: no orphan, nothing else left behind
    storage = JobStorage.for_job(f"file://{tmp_path}/checkpoints", "example_kafka_to_kafka")
    assert any(".parquet" in f for f in storage.files_under("chk-2", []))
    assert audit_job(storage, retained=3, sinks=dag_sinks(example)) == []


def dag_sinks(example: ModuleType) -> list[Any]:
    return list(example.pipeline.job.graph.sinks)


def test_example_kafka_to_kafka_parses_without_broker_or_connection(airflow_db, monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_ORDERS_KAFKA", raising=False)
    module = load_dag_module(REPO / "dags" / "example_kafka_to_kafka.py")
    assert {s.uid for s in module.pipeline.job.graph.sinks} == {"enriched_out", "totals_out"}
