"""The fan-out of a role's permission change to every user holding the role.

`enqueue` changes a role's permissions and fans the change out inline (a small role) or
queues a task; the `worker` loop claims a unit (a task walked whole, or one `shards`
range of a large task split on its first claim, `split`), walks it batch by batch
(`unit_run`: fencing, checkpoints, failures, backpressure; `batch`: one page written into
the outbox by one statement, `page_writer`), and rolls a sharded task's state up
(`rollup`). `claim` holds the claim statements shared by tasks and shards, `tasks` the
row types, `snapshot` the Python builder of the inline fan-out's events, `config` the
worker's settings, `wakeup` its NOTIFY wait, `metrics` its gauges and counters.
"""
