"""Restore: a restore request, the snapshot it names, the restore point a checkpoint starts from."""
