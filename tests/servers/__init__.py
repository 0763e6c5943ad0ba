"""Real servers the tests start on loopback (once per session, only when a test asks for one)."""
