"""The restore DAG (``restore_from_checkpoint``), shipped by the provider: these two lines expose it."""

from airflow_provider_checkpoint.dags import restore_from_checkpoint_dag

dag = restore_from_checkpoint_dag()
