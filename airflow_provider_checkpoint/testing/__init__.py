"""Helpers for tests, the demo and benchmarks of checkpointed pipelines."""
