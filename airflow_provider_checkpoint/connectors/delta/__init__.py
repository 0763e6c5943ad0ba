"""Delta Lake: the log and deletion-vector protocol, storage options, the Delta source and sink."""
