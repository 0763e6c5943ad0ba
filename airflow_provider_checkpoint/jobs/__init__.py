"""What a person does to a job: define it, find it, act on it (savepoint, stop, restore), read its reports, audit it."""
