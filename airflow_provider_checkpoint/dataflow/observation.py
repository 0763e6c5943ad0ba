"""Metrics observed on the pass that computes a DataFrame (``DataFrame.observe``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Observation, Row


def observed_metrics(observation: Observation, recount: Callable[[], Row | None]) -> dict[str, Any]:
    """What ``observation`` recorded on its pass, or ``recount()``'s row where Spark recorded nothing.

    Spark 4 records no metrics when no row reaches the observation (empty input, or files
    holding no record), and ``Observation.get`` then fails an assertion in ``toPyRow``.
    ``recount()`` computes the same metrics in a job of their own; it runs only then.
    """
    try:
        return observation.get
    except Exception as e:  # py4j's error; its class is not importable without a JVM
        if "toPyRow" not in str(e):
            raise
    row = recount()
    if row is None:
        raise RuntimeError("the recount of observed metrics returned no row")
    return row.asDict()
