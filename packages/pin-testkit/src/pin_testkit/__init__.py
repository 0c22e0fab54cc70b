"""Real PostgreSQL and Kafka for the PIN test suites (a pytest plugin)."""
