"""Real services for PIN tests."""
