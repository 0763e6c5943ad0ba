"""How an exception reads as a reason: one line that is never blank, and the full text beside it.

Every decline, abort and refusal the provider reports (XCom, ``_stats``, the Checkpoints page,
``airflow checkpoints``) names its exception by :func:`reason`: the first non-empty line of the
message plus the error class — Spark's (``[UNRESOLVED_COLUMN.WITH_SUGGESTION]``, from
``getCondition()``/``getErrorClass()`` of a ``PySparkException`` or the ``[CLASS]`` a message
starts with), else the Python exception type. :func:`detail` keeps the whole message for the
checkpoint's detail. Both redact URL credentials. No Spark import: exceptions are read by duck typing.
"""

from __future__ import annotations

import re

from airflow_provider_checkpoint.exceptions import redact

_LEADING_CLASS = re.compile(r"^\[([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)\]\s*")
DETAIL_LIMIT = 20_000
"""Characters of an exception's full text kept as a checkpoint's detail."""


def first_line(text: str) -> str:
    """The first line of ``text`` holding more than blanks, stripped; ``""`` when there is none."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def error_class(error: BaseException) -> str | None:
    """Spark's error class of ``error`` (``PARSE_SYNTAX_ERROR``, ``UNRESOLVED_COLUMN.WITH_SUGGESTION``), if any."""
    method = getattr(error, "getCondition", None) or getattr(error, "getErrorClass", None)
    if callable(method):
        try:
            value = method()
        except Exception:  # noqa: BLE001 - a captured error asks the JVM, which may be gone
            value = None
        if isinstance(value, str) and value:
            return value
    match = _LEADING_CLASS.match(first_line(str(error)))
    return match.group(1) if match else None


def reason(error: BaseException) -> str:
    """``<Type> [<ERROR_CLASS>]: <first non-empty line>`` (``<Type>: <line>`` without an error class,
    ``<Type>`` alone for an empty message): never blank, one line, credentials redacted."""
    line = first_line(str(error))
    kind = type(error).__name__
    cls = error_class(error)
    if cls is not None:
        kind = f"{kind} [{cls}]"
        line = line[len(f"[{cls}]") :].strip() if line.startswith(f"[{cls}]") else line
    return redact(f"{kind}: {line}" if line else kind)


_DETERMINISTIC_TYPES = frozenset(
    {"AnalysisException", "ParseException", "PySparkTypeError", "PySparkValueError", "PySparkAttributeError"}
)
"""Spark's exceptions (by class name, Spark Connect's included) that a retry raises again."""
_TRANSIENT_CLASSES = ("PATH_NOT_FOUND",)
"""Error classes of those that storage can cure (a path not yet visible)."""


def deterministic(error: BaseException) -> bool:
    """Whether running the same step again must fail the same way: Spark could not analyse or parse its plan
    (``AnalysisException``, ``ParseException``, a PySpark argument error), or Python found a programming
    error (``TypeError``, ``NameError``, ``AttributeError``, ``SyntaxError``). IO, connection and memory
    errors, killed tasks and everything else are transient: retried."""
    names = {kind.__name__ for kind in type(error).__mro__}
    if names & _DETERMINISTIC_TYPES:
        return (error_class(error) or "").split(".")[0] not in _TRANSIENT_CLASSES
    return isinstance(error, TypeError | NameError | AttributeError | SyntaxError)


def detail(error: BaseException) -> str:
    """The full text of ``error`` (its type first), credentials redacted, at most :data:`DETAIL_LIMIT` characters."""
    text = f"{type(error).__name__}: {str(error).strip()}"
    return redact(text)[:DETAIL_LIMIT]
