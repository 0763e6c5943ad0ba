"""Reading values of untrusted stored documents (``_stats``, ``_job.json``, registry entries, XCom):
each helper returns the value when it has the expected type and range, else ``None`` (never raises).

Completes :mod:`airflow_provider_checkpoint.core.stats` (``count``, ``number``, ``seconds``, ``text``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_provider_checkpoint.core.stats import count, number, seconds, text
from airflow_provider_checkpoint.exceptions import redact

__all__ = ["count", "flag", "mapping", "name", "number", "positive", "seconds", "text", "text_or_none", "target"]


def mapping(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def flag(value: Any) -> bool | None:
    """A boolean; the metric form ``0`` / ``1`` counts too."""
    if isinstance(value, bool):
        return value
    return bool(value) if type(value) is int and value in (0, 1) else None


def positive(value: Any) -> int | None:
    """A positive integer (a setting such as retained checkpoints)."""
    return value if type(value) is int and value >= 1 else None


def text_or_none(value: Any, limit: int = 2000) -> str | None:
    return text(value, limit) if isinstance(value, str) else None


def name(value: Any) -> str | None:
    """A short identifier (a step, sink or source uid, a task id), else ``None``."""
    return value if isinstance(value, str) and 0 < len(value) <= 250 else None


def target(value: Any) -> str | None:
    """A location (table path, ``schema.table``, URL) with its credentials redacted."""
    return redact(text(value, 4096)) if isinstance(value, str) else None
