"""What the operator's commands show and do to the queue: `tasks list/show/replay`
(`tasks`), a sharded task's shards (`shards`), the quarantine's listings (`quarantine`)."""
