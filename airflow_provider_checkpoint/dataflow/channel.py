"""A step boundary of the dataflow graph: the channel one step stages for the steps downstream."""

from __future__ import annotations

from airflow_provider_checkpoint.dataflow.graph import StepOutput


class Channel(StepOutput):
    """A step boundary: everything upstream runs in one step, which stages this node's records
    for checkpoint N as a channel; steps downstream read exactly that channel.

    The producing step is named by ``step`` (default ``step_<uid>``). A downstream step
    depends on it in the DAG, and its retry reuses the channel instead of re-running the
    upstream step (region failover). A step reading channels of several upstream steps
    aligns on the channels of the same checkpoint from all of them.
    """

    kind = "channel"

    def unique_keys(self) -> tuple[str, ...] | None:
        return self.inputs[0].unique_keys()

    def deletes_column(self) -> str | None:
        return self.inputs[0].deletes_column()
