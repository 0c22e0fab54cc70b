"""What the operator's commands show: the system at a glance (`status`), the queue (`tasks`:
tasks, one task with its progress, its shards, a watch of it), roles (`roles`: a permission
change and its dry run, one role with its pending work), the outbox (`outbox`: `outbox
status`) and the quarantine (`quarantine`), as tables (`cells`: one way to show a value)."""
