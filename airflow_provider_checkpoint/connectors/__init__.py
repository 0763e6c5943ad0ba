"""Sources and sinks, one package per external system, as Flink's connectors are.

- :mod:`.base`: what every transactional sink shares: the writer/committer interface
  (:class:`~.base.sink.TransactionalSink`), the finalize-side :class:`~.base.committer.SinkCommitter`,
  the upsert rule and the bucketed upsert files.
- :mod:`.files`: landing directories, :class:`~.files.source.FileSource` with its dead letters,
  and :class:`~.files.parquet_sink.ParquetTableSink`.
- :mod:`.delta`: the Delta Lake log and deletion-vector protocol, :class:`~.delta.source.DeltaSource`
  and :class:`~.delta.sink.DeltaTableSink`.
- :mod:`.postgres`: :class:`~.postgres.sink.PostgresTableSink`, its SQL, undo log and dead letters.

Pipelines import these classes from :mod:`airflow_provider_checkpoint.dataflow`.
"""
