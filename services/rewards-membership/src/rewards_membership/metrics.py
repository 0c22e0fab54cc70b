"""The consumer's Prometheus metrics, on a registry of its own (never the global one).

Each metric is declared once, in `metrics.toml` next to this module (name, help, labels,
buckets); `Metrics` gives each its typed attribute. Names are the spec's, exactly; the
additions (duplicates, offset lag, retries) follow the same prefix.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from pin_runtime.metrics import MetricSet, load_catalogue
from rewards_membership.rules.validation import KEY_PROBLEMS

__all__ = ["AUTH_DEPENDENCIES", "CONTRACT_VERSION_LABELS", "Metrics", "contract_version_label"]

AUTH_DEPENDENCIES = ("postgresql", "kafka")
"""The `dependency` label of rewards_membership_auth_failures_total: whose login was refused."""

CONTRACT_VERSION_LABELS = 16
"""ContractVersion values 1..16 get a label of their own; any other value the contract admits
(up to 2^31 - 1: whatever a producer put on the wire) is counted under "other", so a bad
producer cannot grow the number of series without bound."""


def contract_version_label(version: int) -> str:
    """The `contract_version` label of a ContractVersion read from the wire (bounded)."""
    return str(version) if 1 <= version <= CONTRACT_VERSION_LABELS else "other"


class Metrics(MetricSet):
    """Every metric of the consumer, bound from `metrics.toml` (checked at import)."""

    catalogue = load_catalogue("rewards_membership", "metrics.toml")

    consume_duration_ms: Histogram
    applied: Counter
    skipped_stale: Counter
    skipped_duplicate: Counter
    unknown_status: Counter
    unknown_reason: Counter
    lag_seconds: Gauge
    dlq: Counter
    contract_mismatch: Counter
    key_mismatch: Counter
    consumer_lag: Gauge
    retries: Counter
    paused_partitions: Gauge
    paused_by_reason: Gauge
    partition_paused_seconds: Gauge
    dlq_unreplayed: Gauge
    dlq_replaced: Counter
    batch_size: Histogram
    auth_failures: Counter

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        if registry is None:
            registry = CollectorRegistry(auto_describe=True)
        super().__init__(registry)

    def __post_init__(self) -> None:
        # Every reason is exported from the start (at 0): an alert on its increase sees the
        # first wrong key, not a series that appears with it.
        for reason in KEY_PROBLEMS:
            self.key_mismatch.labels(reason)
        for dependency in AUTH_DEPENDENCIES:
            self.auth_failures.labels(dependency)
