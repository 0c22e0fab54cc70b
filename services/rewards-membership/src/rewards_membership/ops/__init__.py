"""The operator's commands, one module per family: `status` (lag, paused partitions and
dead letters pending, at a glance), `dlq` (list, replay, resolve), `agent` (`agent show`),
`inbox` (`inbox prune`); `tool` is what they share (their database connection, `--json`'s
lines). `cli` parses the arguments and wires each command to its module."""
