"""PostgreSQL: the table sink, its SQL, its undo log and its dead-letter table."""
