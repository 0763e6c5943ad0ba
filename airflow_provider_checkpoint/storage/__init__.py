"""Checkpoint storage over fsspec: the job directory layout (:mod:`.job_storage`), the job record and
lease (:mod:`.job_records`), the completed checkpoints (:mod:`.checkpoint_store`), stats
(:mod:`.stats`) and atomic writes (:mod:`.writes`)."""

from airflow_provider_checkpoint.storage.job_storage import JobStorage, Location

__all__ = ["JobStorage", "Location"]
