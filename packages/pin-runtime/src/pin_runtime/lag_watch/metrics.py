"""The lag watcher's metrics (catalogue: `metrics.toml`)."""

from __future__ import annotations

from typing import Final

from prometheus_client import Counter, Gauge, Histogram

from pin_runtime.metrics import MetricSet, load_catalogue

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
    catalogue = load_catalogue("pin_runtime", "lag_watch/metrics.toml")

    lag: Gauge
    lag_seconds: Gauge
    last_success: Gauge
    groups: Gauge
    errors: Counter
    pass_seconds: Histogram
    topic_partitions: Gauge
    catalogue_partitions: Gauge

    def __post_init__(self) -> None:
        for kind in ERROR_KINDS:  # every kind exported from the start, at 0
            self.errors.labels(kind)
