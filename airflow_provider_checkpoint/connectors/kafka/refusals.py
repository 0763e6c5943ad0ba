"""Telling a broker's refusal (credentials, access) from a broker that is down, and saying it without secrets."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, TypeGuard

from airflow_provider_checkpoint.exceptions import KafkaSourceError, redact

if TYPE_CHECKING:
    from confluent_kafka import KafkaError

SECRET = re.compile(r"(password|secret|token|key\.pem|keystore|credentials)", re.IGNORECASE)
"""A client property whose value is a secret: never shown."""
_UNAUTHENTICATED = ("_AUTHENTICATION", "SASL_AUTHENTICATION_FAILED", "UNSUPPORTED_SASL_MECHANISM", "ILLEGAL_SASL_STATE")
_UNAUTHORIZED = (
    "TOPIC_AUTHORIZATION_FAILED",
    "GROUP_AUTHORIZATION_FAILED",
    "CLUSTER_AUTHORIZATION_FAILED",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
)
_CUT_OFF = re.compile(r"transport failure|disconnected|connection refused|timed out", re.IGNORECASE)
"""An ``_AUTHENTICATION`` error saying this: the connection broke during the login, not a refusal."""


def refused(error: KafkaError | None) -> TypeGuard[KafkaError]:
    """Whether ``error`` says the broker refused the credentials (SASL) or the access (an ACL)."""
    if error is None:
        return False
    name = error.name()
    return name in _UNAUTHORIZED or (name in _UNAUTHENTICATED and not _CUT_OFF.search(error.str()))


def refusal(name: str, config: Mapping[str, str], error: KafkaError, mark: str = "") -> KafkaSourceError:
    """The refusal of ``error`` (see :func:`refused`), one line naming connection ``name`` and the broker
    address; every secret value of ``config`` that librdkafka's text might hold is replaced by ``***``."""
    detail = error.str()
    for key, value in config.items():
        if SECRET.search(key) and value:
            detail = detail.replace(value, "***")
    detail = redact(" ".join(detail.split()))[:300]
    what = "access" if error.name() in _UNAUTHORIZED else "the credentials"
    return KafkaSourceError(
        f"{mark}Kafka connection {name!r}: the broker {config.get('bootstrap.servers', '?')} refused {what} "
        f"({error.name()}: {detail}); fix the connection's security.protocol/sasl.* settings or the ACLs. "
        "Nothing was read or committed"
    )


class Refusals:
    """librdkafka's error callback on our own clients: keeps the first error that is a refusal."""

    def __init__(self) -> None:
        self.first: KafkaError | None = None

    def __call__(self, error: KafkaError) -> None:
        if self.first is None and refused(error):
            self.first = error

    def check(self, name: str, config: Mapping[str, str], mark: str = "") -> None:
        """Raise the refusal (:func:`refusal`) if the broker refused since the client was made."""
        if self.first is not None:
            raise refusal(name, config, self.first, mark)
