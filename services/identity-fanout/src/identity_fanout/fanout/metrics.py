"""Prometheus metrics of the fan-out worker. The first six names are the spec's, exactly.

Each metric is declared once, in `metrics.toml` next to this module (name, help, labels,
buckets and why those buckets); `FanoutMetrics` gives each its typed attribute.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from pin_runtime.metrics import MetricSet, load_catalogue


class FanoutMetrics(MetricSet):
    """Every metric of the worker, on one registry (never the process-global default)."""

    catalogue = load_catalogue("identity_fanout", "fanout/metrics.toml")

    task_duration_ms: Histogram
    users: Counter
    queue_backlog: Gauge
    errors: Counter
    task_lag_seconds: Histogram
    size: Histogram
    tasks: Counter
    shards: Counter
    batches: Counter
    failed_tasks: Gauge
    leased_tasks: Gauge
    oldest_task_age_seconds: Gauge
    oldest_waiting_seconds: Gauge
    last_success: Gauge
    outbox_backlog: Gauge
    outbox_oldest_age_seconds: Gauge
    throttled: Gauge
    throttled_seconds: Counter
    database_auth_failures: Counter

    def __post_init__(self) -> None:
        # Every label value exported from the start (at 0), so rates and alerts see a series
        # before its first event.
        for kind in ("batch", "outage", "poll", "lease_lost", "poison"):
            self.errors.labels(kind=kind)
        for outcome in ("completed", "failed", "lease_lost", "released", "superseded"):
            self.tasks.labels(outcome=outcome)
            self.shards.labels(outcome=outcome)
