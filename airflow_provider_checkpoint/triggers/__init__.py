"""Triggers of the checkpoint sensors (run in the triggerer; no blocking I/O in the event loop)."""
