"""The two-phase-commit machinery every sink shares: writer/committer interface, committer, upsert rule, buckets."""
