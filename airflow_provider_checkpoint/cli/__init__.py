"""``airflow checkpoints …``: the provider's CLI, registered through the provider info ``cli`` key."""
