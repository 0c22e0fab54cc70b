"""The Kafka side of the consumer: the `loop` (batches polled, applied and committed, Kafka
and PostgreSQL overlapped), the batch in flight (`batch`: which records stay ours,
finishing and reporting it, all in `Batches`; `decided`: a record and its outcome, from the
decision to the report), the database side (`database`: the one thread every statement
runs on and the transaction that applies a batch), the partitions (`partitions`: pause,
seek back, resume, commit, with the pure `PartitionPauser` and `OffsetLedger` that decide
them; `rebalance`), the stall gauges (`lag`), and the telemetry of a committed batch
(`report`, `spans`). A consumed message's fields are read with `rewards_membership.records`
(shared with `dlq`); the dead letters are written with `dlq.writer`."""
