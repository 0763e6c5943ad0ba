"""Airflow hooks of the provider."""
