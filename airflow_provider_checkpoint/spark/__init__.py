"""The Spark side: the session, the step runner, channels between steps, and where a step runs
(embedded, spark-submit, Spark Connect)."""
