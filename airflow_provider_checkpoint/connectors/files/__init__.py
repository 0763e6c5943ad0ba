"""Files: landing directories and file sources (with dead letters), and the Parquet table sink."""
