"""Airflow operators of a checkpoint."""
