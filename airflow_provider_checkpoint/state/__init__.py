"""Keyed state: key groups, handles, the state file format and incremental bookkeeping, with two backends.

- pure Python (like :mod:`~airflow_provider_checkpoint.core`): :mod:`.keygroups`, :mod:`.handles`,
  :mod:`.incremental`;
- on storage, read with pyarrow alone: :mod:`.files`, :mod:`.ownership`, :mod:`.savepoints`;
- the backends: :mod:`.spark_backend` (state joined and written by Spark) and
  :mod:`.driver_merge` (small changes merged on the driver); :mod:`.checkpointing` runs a
  stateful operator's step on either.
"""
