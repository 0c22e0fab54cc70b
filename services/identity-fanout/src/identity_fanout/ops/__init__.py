"""What the operator's commands show: the queue (`tasks`: tasks, one task, its shards) and the
quarantine (`quarantine`), as tables."""
