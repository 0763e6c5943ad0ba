"""Spark reading and writing files through fsspec: the engine connectors, channels and state files share."""
