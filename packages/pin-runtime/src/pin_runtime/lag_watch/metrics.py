"""The lag watcher's metrics.

The two lag gauges carry danielqsj/kafka_exporter's names and labels, so the alerts read the
same series whichever of the two a cluster runs; the watcher's own metrics are
`pin_lag_watcher_*`.
"""

from __future__ import annotations

from typing import Final

from pin_runtime.metrics import MetricSet, counter, gauge, histogram

__all__ = ["ERROR_KINDS", "LagWatchMetrics"]

ERROR_KINDS: Final = (
    "metadata",
    "discovery",
    "offsets",
    "watermarks",
    "timestamps",
    "groups-limit",
)


class LagWatchMetrics(MetricSet):
    lag = gauge(
        "kafka_consumergroup_lag",
        "Records of the partition the consumer group has not consumed "
        "(high watermark - committed offset)",
        labels=("consumergroup", "topic", "partition"),
    )
    lag_seconds = gauge(
        "kafka_consumergroup_lag_seconds",
        "Age of the oldest record the consumer group has not consumed (s); 0 when caught up",
        labels=("consumergroup", "topic", "partition"),
    )
    last_success = gauge(
        "pin_lag_watcher_last_success_timestamp_seconds",
        "Unix time of the last pass that read the lag of every watched group of the topic "
        "(0: none yet)",
        labels=("topic",),
    )
    groups = gauge(
        "pin_lag_watcher_groups",
        "Consumer groups watched on the topic (listed and discovered)",
        labels=("topic",),
    )
    errors = counter(
        "pin_lag_watcher_errors",
        "Failed reads of a pass, by kind: "
        "metadata, discovery, offsets, watermarks, timestamps, groups-limit",
        labels=("kind",),
    )
    pass_seconds = histogram(
        "pin_lag_watcher_pass_seconds",
        "Duration of one pass over every watched group (s)",
        # A pass is a few batched broker round trips; a slow one waits for a request
        # timeout (10 s).
        buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    )
    topic_partitions = gauge(
        "pin_lag_watcher_topic_partitions",
        "Partitions of the watched topic in the cluster's metadata, as the last pass read them",
        labels=("topic",),
    )
    catalogue_partitions = gauge(
        "pin_lag_watcher_topic_partitions_expected",
        "Partitions the topic catalogue fixes for the watched topic (its key's partition "
        "depends on it); absent for a topic outside the catalogue",
        labels=("topic",),
    )

    def __post_init__(self) -> None:
        for kind in ERROR_KINDS:  # every kind exported from the start, at 0
            self.errors.labels(kind)
