"""The Spark side: session, keyed state backend and the step runner."""
