"""The fan-out of a role's permission change to every user holding the role.

`enqueue` changes a role's permissions and fans the change out inline (a small role, as one
page) or queues a task. The `worker` loop claims a unit from the `queue` (a task walked
whole, or one shard of a large task split on its first claim) and `walk`s it batch by batch
(fencing, failures, backpressure, endings); each `batch` is one transaction that writes a
page of events into the outbox. Both paths write their events with `page`, one statement
that builds every user's UserAccessChanged record inside PostgreSQL: the event has one
builder. `queue` is the one gateway to the task and shard tables, `assignments` to what the
fan-out reads of the role model beside the page (counts, shard bounds); `shards` holds the
pure decisions of splitting and rolling up, `metrics` the worker's gauges and counters.
"""
