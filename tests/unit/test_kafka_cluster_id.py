"""The test broker's KRaft cluster id is one ``kafka-storage format -t`` takes (a leading ``-`` reads as an option)."""

from __future__ import annotations

import base64
import uuid

from tests.servers import kafka


def test_a_cluster_id_never_starts_with_a_dash(monkeypatch) -> None:
    dashed = uuid.UUID(bytes=base64.urlsafe_b64decode("-" + "A" * 21 + "=="))  # encodes to "-AAAA…"
    drawn = iter([dashed, uuid.UUID(int=1)])
    monkeypatch.setattr(kafka.uuid, "uuid4", lambda: next(drawn))
    assert kafka.cluster_id() == base64.urlsafe_b64encode(uuid.UUID(int=1).bytes).decode().rstrip("=")
    monkeypatch.undo()
    for _ in range(2000):
        cluster = kafka.cluster_id()
        assert not cluster.startswith("-") and len(cluster) == 22
