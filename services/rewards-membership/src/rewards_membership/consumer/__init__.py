"""The Kafka side of the consumer: the `loop` (batches polled, applied and committed, Kafka
and PostgreSQL overlapped), the batch (`batch`: one `Batch` value from its poll to its
report, and `Batches`, which hands it over, finishes it and reports it), the database side
(`database`: the one thread every statement runs on and the transaction that applies a
batch), the partitions (`partitions`: pause, seek back, resume, commit, with the pure
`PartitionPauser` and `OffsetLedger` that decide them; `rebalance`), the stall gauges
(`lag`), and the telemetry of a committed batch (`report`, `spans`). A consumed record is a
`rewards_membership.records.Record` (shared with `dlq`); the dead letters are written with
`dlq.writer`."""
