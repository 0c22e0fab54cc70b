"""What the operator's commands show: the queue (`tasks`: tasks, one task, its shards), the
outbox (`outbox`: `outbox status`) and the quarantine (`quarantine`), as tables."""
