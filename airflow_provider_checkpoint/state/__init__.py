"""Snapshots and their state files on storage: open, verify and read them with pyarrow alone; write savepoints."""
