"""Helpers for the tests, the demo and the benchmarks of checkpointed pipelines.

The package ships in the wheel for one user only: the class-data sharing archive's training run
(``python -m airflow_provider_checkpoint.spark.cds``) drives three checkpoints of a small pipeline in
one process with :mod:`.inprocess` over events from :mod:`.clickstream`. No other provider code
uses it.
"""
