"""The Kafka side of the consumer: the `loop` (batches polled, applied and committed, Kafka
and PostgreSQL overlapped), the batch in flight (`inflight`, `pipeline`, `finish`, the
database thread `db_lane` and what it runs, `applier`), the partitions (`partitions`:
pause, seek back, resume, commit; `pauser` and `ledger` their pure bookkeeping;
`rebalance`), the stall gauges (`lag`), and the telemetry of a committed batch (`report`,
`spans`); `records` reads a consumed message's fields."""
