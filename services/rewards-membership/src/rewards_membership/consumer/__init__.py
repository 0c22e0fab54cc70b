"""The Kafka side of the consumer: the `loop` (batches polled, applied and committed, Kafka
and PostgreSQL overlapped), the batch in flight (`inflight`, `pipeline`, `finish`, the
database thread `db_thread` and what it runs, `applier`), the partitions (`partitions`:
pause, seek back, resume, commit, with the pure `PartitionPauser` and `OffsetLedger` that
decide them; `rebalance`), the stall gauges (`lag`), and the telemetry of a committed
batch (`report`, `spans`); `records` reads a consumed message's fields."""
