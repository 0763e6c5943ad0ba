"""Sensors over checkpointed jobs: new input for a pipeline, a committed checkpoint for downstream DAGs."""
