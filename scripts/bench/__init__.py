"""Benchmark package: the provider's checkpointed pipeline against Spark Structured Streaming.

``workloads`` generates the data, ``sides`` runs one increment on either side, ``measure``
counts bytes, seconds and CPU, ``inprocess`` and ``longrun`` are the modes, ``report``
renders Markdown into ``docs/benchmarks.md``. Entry point: ``scripts/benchmark.py``.
"""
