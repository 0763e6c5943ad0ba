"""The checkpoint protocol as pure rules: no Airflow, Spark or filesystem import.

Everything here is a value or a decision over values, so the rules that make a
pipeline exactly-once are unit-tested in milliseconds.
"""
