"""Metric declarations on one registry, one line per metric.

Every service declares its metrics on a registry of its own (never the process-global
default); `Metrics(registry)` binds it once, so a declaration names only what differs: the
name, the help text, the labels and, for a histogram, the buckets.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["MetricDeclarations"]


class MetricDeclarations:
    """Counters, gauges and histograms declared on `registry`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def counter(self, name: str, documentation: str, *labels: str) -> Counter:
        return Counter(name, documentation, labels, registry=self.registry)

    def gauge(self, name: str, documentation: str, *labels: str) -> Gauge:
        return Gauge(name, documentation, labels, registry=self.registry)

    def histogram(
        self, name: str, documentation: str, buckets: Sequence[float], *labels: str
    ) -> Histogram:
        return Histogram(name, documentation, labels, buckets=buckets, registry=self.registry)
