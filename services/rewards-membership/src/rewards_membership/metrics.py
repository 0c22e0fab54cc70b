"""The consumer's Prometheus metrics, on a registry of its own (never the global one).

Names are the spec's, exactly; the additions (duplicates, offset lag, retries) follow the
same prefix.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from pin_runtime.metrics import MetricDeclarations

__all__ = ["CONTRACT_VERSION_LABELS", "Metrics", "contract_version_label"]

CONTRACT_VERSION_LABELS = 16
"""ContractVersion values 1..16 get a label of their own; any other value the contract admits
(up to 2^31 - 1: whatever a producer put on the wire) is counted under "other", so a bad
producer cannot grow the number of series without bound."""


def contract_version_label(version: int) -> str:
    """The `contract_version` label of a ContractVersion read from the wire (bounded)."""
    return str(version) if 1 <= version <= CONTRACT_VERSION_LABELS else "other"


# Per-message latency of a batch (poll return -> offsets committed), in milliseconds.
_DURATION_BUCKETS_MS = (1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        m = MetricDeclarations(self.registry)
        self.consume_duration_ms = m.histogram(
            "rewards_membership_consume_duration_ms",
            "Milliseconds from a batch's poll to its offset commit, observed once per message",
            _DURATION_BUCKETS_MS,
        )
        self.applied = m.counter(
            "rewards_membership_applied_total",
            "Membership changes applied to their agent_performance row, by stored status",
            "status",
        )
        self.skipped_stale = m.counter(
            "rewards_membership_skipped_stale_total",
            "Events at or below the row's LastMembershipVersion (skipped-stale-membership)",
        )
        self.skipped_duplicate = m.counter(
            "rewards_membership_skipped_duplicate_total",
            "Redeliveries of an already processed MessageId (skipped-duplicate)",
        )
        self.unknown_status = m.counter(
            "rewards_membership_unknown_status_total",
            "Events with a Status outside {Active, Left}, applied fail-closed as Left",
        )
        self.unknown_reason = m.counter(
            "rewards_membership_unknown_reason_total",
            "Left events with an unknown Reason, applied as Left without a reason",
        )
        self.lag_seconds = m.gauge(
            "rewards_identity_membership_lag_seconds",
            "Seconds between the oldest event of the last batch (OccurredAt) and its processing",
        )
        self.dlq = m.counter(
            "rewards_identity_membership_dlq_total",
            "Records dead-lettered (alert when > 0)",
            "code",
        )
        self.contract_mismatch = m.counter(
            "rewards_contract_mismatch_total",
            "Events whose ContractVersion differs from the one this consumer was built for",
            "contract_version",
        )
        self.consumer_lag = m.gauge(
            "rewards_identity_membership_consumer_lag",
            "Messages between the partition's high watermark and the group's committed offset,"
            " refreshed every lag interval whether or not batches succeed",
            "partition",
        )
        self.retries = m.counter(
            "rewards_membership_retries_total",
            "Batches rolled back for an infrastructure failure (partitions paused, retried)",
            "dependency",
        )
        self.paused_partitions = m.gauge(
            "rewards_membership_paused_partitions",
            "Partitions paused while a dependency is down or their dead letter cannot be written",
        )
        self.partition_paused_seconds = m.gauge(
            "rewards_membership_partition_paused_seconds",
            "Seconds a partition has been paused (present only while it is paused)",
            "partition",
        )
        self.dlq_unreplayed = m.gauge(
            "rewards_identity_membership_dlq_unreplayed",
            "Dead letters neither replayed nor resolved (open dead-letter marks), alert when > 0",
        )
        self.dlq_replaced = m.counter(
            "rewards_identity_membership_dlq_replaced_total",
            "Dead letters the DLQ refused as they were, written as reference records",
            "reason",
        )
        self.batch_size = m.histogram(
            "rewards_membership_batch_messages",
            "Messages per applied batch",
            (1, 10, 50, 100, 250, 500, 1000, 2500, 5000, 10000),
        )
