"""A step boundary of the dataflow graph: the channel one step stages for the steps downstream."""

from __future__ import annotations

from airflow_provider_checkpoint.dataflow.graph import Node, step_name


class Channel(Node):
    """A step boundary: everything upstream runs in one step, which stages this node's records
    for checkpoint N as a channel; steps downstream read exactly that channel.

    The producing step is named by ``step`` (default ``step_<uid>``). A downstream step
    depends on it in the DAG, and its retry reuses the channel instead of re-running the
    upstream step (region failover). A step reading channels of several upstream steps
    aligns on the channels of the same checkpoint from all of them.
    """

    kind = "channel"

    job_id: str | None = None
    """The job this sink writes for, once bound (:meth:`bind_job`)."""

    def __init__(self, uid: str, input: Node, step: str | None = None) -> None:
        super().__init__(uid, [input])
        self.step = step_name(uid, step)

    def bind_job(self, job_id: str) -> None:
        """Bind the sink to the job it writes for (the coordinator, the step and the audit do): what the
        target's stored claim says is checked against it, never used in its place."""
        self.job_id = job_id

    def unique_keys(self) -> tuple[str, ...] | None:
        return self.inputs[0].unique_keys()

    def deletes_column(self) -> str | None:
        return self.inputs[0].deletes_column()
