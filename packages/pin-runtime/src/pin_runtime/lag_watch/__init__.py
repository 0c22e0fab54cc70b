"""The lag watcher: consumer-group lag measured at the brokers, by a process of its own.

A consumer that reports its own lag reports nothing once it is down, crash-looping or stuck,
and then the lag alerts have no series to fire on. The watcher asks the brokers instead: every
interval, each watched group's committed offsets on each watched topic partition, the
partition's watermarks, and the timestamp of the oldest record the group has not consumed.
It exports them under kafka_exporter's names (`kafka_consumergroup_lag`, plus
`kafka_consumergroup_lag_seconds`), so the alerts read the same series whichever of the two
runs.

- `settings`: `LagWatchSettings`, the base of each service's watcher settings.
- `lag`: the pure part: the lag of a partition, and `LagBook`, what the gauges show between
  passes (kept, aged, dropped).
- `brokers`: the reads from Kafka (admin client and an assign-only reader).
- `watcher`: one pass and the loop around it.
- `cli`: the `lag-watch` command of each service's CLI (no Kafka client loaded until it runs);
  `app` its composition root.

Nothing is re-exported here: importing the settings or the command does not load librdkafka.
"""
