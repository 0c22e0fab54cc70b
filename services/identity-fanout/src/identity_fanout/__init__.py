"""PIN identity access fan-out: worker, outbox relay, enqueue side."""
