"""The consumer's Prometheus metrics, on a registry of its own (never the global one).

Each metric is declared once, as an attribute of `Metrics` (name, help, labels, buckets).
Names are the spec's, exactly; the additions (duplicates, offset lag, retries) follow the
same prefix. A counter's name may end in `_total` or not: it is exported with `_total`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from pin_contracts import REWARDS_MEMBERSHIP_EVENT_INVALID, AgentMembershipStatus
from pin_runtime.delivery import NON_RETRIABLE
from pin_runtime.metrics import MetricSet, counter, gauge, histogram
from rewards_membership.rules.validation import EXPECTED_CONTRACT_VERSION, KEY_PROBLEMS

__all__ = [
    "AUTH_DEPENDENCIES",
    "CONTRACT_VERSION_LABELS",
    "Metrics",
    "contract_version_label",
    "contract_version_labels",
]

AUTH_DEPENDENCIES = ("postgresql", "kafka")
"""The `dependency` label of rewards_membership_auth_failures_total: whose login was refused."""

CONTRACT_VERSION_LABELS = 16
"""ContractVersion values 1..16 get a label of their own; any other value the contract admits
(up to 2^31 - 1: whatever a producer put on the wire) is counted under "other", so a bad
producer cannot grow the number of series without bound."""


def contract_version_label(version: int) -> str:
    """The `contract_version` label of a ContractVersion read from the wire (bounded)."""
    return str(version) if 1 <= version <= CONTRACT_VERSION_LABELS else "other"


def contract_version_labels() -> list[str]:
    """Every `contract_version` label a mismatch can carry: each version with a label of its
    own but the expected one (never a mismatch), and "other"."""
    expected = contract_version_label(EXPECTED_CONTRACT_VERSION)
    labels = [contract_version_label(v) for v in range(1, CONTRACT_VERSION_LABELS + 1)]
    return [label for label in [*labels, "other"] if label != expected]


class Metrics(MetricSet):
    """Every metric of the consumer (checked at import)."""

    consume_duration_ms = histogram(
        "rewards_membership_consume_duration_ms",
        "Milliseconds from a batch's poll to its offset commit, observed once per message",
        # Per-message latency of a batch (poll return -> offsets committed), in milliseconds.
        buckets=(1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000),
    )
    applied = counter(
        "rewards_membership_applied_total",
        "Membership changes applied to their agent_performance row, by stored status",
        labels=("status",),
    )
    skipped_stale = counter(
        "rewards_membership_skipped_stale_total",
        "Events at or below the row's LastMembershipVersion (skipped-stale-membership)",
    )
    skipped_duplicate = counter(
        "rewards_membership_skipped_duplicate_total",
        "Redeliveries of an already processed MessageId (skipped-duplicate)",
    )
    unknown_status = counter(
        "rewards_membership_unknown_status_total",
        "Events with a Status outside {Active, Left}, applied fail-closed as Left",
    )
    unknown_reason = counter(
        "rewards_membership_unknown_reason_total",
        "Left events with an unknown Reason, applied as Left without a reason",
    )
    lag_seconds = gauge(
        "rewards_identity_membership_lag_seconds",
        "Seconds between the oldest event of the last batch (OccurredAt) and its processing",
    )
    dlq = counter(
        "rewards_identity_membership_dlq_total",
        "Records dead-lettered (alert when > 0)",
        labels=("code",),
    )
    contract_mismatch = counter(
        "rewards_contract_mismatch_total",
        "Events whose ContractVersion differs from the one this consumer was built for",
        labels=("contract_version",),
    )
    key_mismatch = counter(
        "rewards_membership_key_mismatch_total",
        "Valid events whose Kafka key is missing, not UTF-8, or not the payload's AgentUserId "
        "(canonical UUID text), applied all the same",
        labels=("reason",),
    )
    consumer_lag = gauge(
        "rewards_identity_membership_consumer_lag",
        "Messages between the partition's high watermark and the group's committed offset, "
        "refreshed every lag interval whether or not batches succeed",
        labels=("partition",),
    )
    retries = counter(
        "rewards_membership_retries_total",
        "Batches rolled back for an infrastructure failure (partitions paused, retried)",
        labels=("dependency",),
    )
    paused_partitions = gauge(
        "rewards_membership_paused_partitions",
        "Partitions paused while a dependency is down or their dead letter cannot be written",
    )
    paused_by_reason = gauge(
        "rewards_membership_paused_partitions_by_reason",
        "Partitions paused, by why: postgresql or kafka unavailable, or lock_timeout (a row of "
        "the partition locked elsewhere; the other partitions go on)",
        labels=("reason",),
    )
    partition_paused_seconds = gauge(
        "rewards_membership_partition_paused_seconds",
        "Seconds a partition has been paused (present only while it is paused)",
        labels=("partition",),
    )
    dlq_unreplayed = gauge(
        "rewards_identity_membership_dlq_unreplayed",
        "Dead letters neither replayed nor resolved (open dead-letter marks), alert when > 0",
    )
    dlq_replaced = counter(
        "rewards_identity_membership_dlq_replaced_total",
        "Dead letters the DLQ refused as they were, written as reference records",
        labels=("reason",),
    )
    batch_size = histogram(
        "rewards_membership_batch_messages",
        "Messages per applied batch",
        buckets=(1, 10, 50, 100, 250, 500, 1000, 2500, 5000, 10000),
    )
    auth_failures = counter(
        "rewards_membership_auth_failures_total",
        "Logins refused to the consumer, by dependency: postgresql (a connect refused, "
        "SQLSTATE 28P01 invalid_password or 28000 invalid_authorization_specification) or "
        "kafka (SASL authentication failed, each time librdkafka tries again); "
        "a rotated password or a wrong secret",
        labels=("dependency",),
    )

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        if registry is None:
            registry = CollectorRegistry(auto_describe=True)
        super().__init__(registry)

    def __post_init__(self) -> None:
        # Every known label value of every labelled counter is exported from the start (at
        # 0), as identity's outcomes are: an alert or a rate on its increase sees the first
        # event, not a series that appears with it (an absent series has no increase).
        for status in AgentMembershipStatus:  # the spec's {status}: Active, Left
            self.applied.labels(status.value)
        # The spec's one contract violation (an unknown Status is applied, as Left).
        self.dlq.labels(REWARDS_MEMBERSHIP_EVENT_INVALID)
        for version in contract_version_labels():
            self.contract_mismatch.labels(version)
        for reason in KEY_PROBLEMS:
            self.key_mismatch.labels(reason)
        for dependency in AUTH_DEPENDENCIES:
            # A batch is retried for the same two dependencies whose logins can be refused.
            self.retries.labels(dependency)
            self.auth_failures.labels(dependency)
        for reason in sorted(set(NON_RETRIABLE.values())):  # why the DLQ refused a copy
            self.dlq_replaced.labels(reason)
