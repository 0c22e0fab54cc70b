"""When the relay pauses for a refusal of the cluster, and when it resumes. Pure.

A cluster-wide refusal (`pin_runtime.delivery.CLUSTER_WIDE`: the relay's principal may not
write a topic or use the cluster, its credentials are refused, the topic does not exist)
would refuse every row behind the first one alike, so it is never a reason to quarantine:
the relay stops there as for an outage (the rows stay in the outbox in id order, nothing is
quarantined or deleted), retries with backoff and goes on by itself once Kafka takes a row
again. A topic with fewer partitions than the catalogue's is refused alike (partition-count:
its records name partitions that may not exist, `partitions`). Unlike an outage it needs an
operator, so it says so: one log line when the relay pauses (or the refusal changes), one
when it resumes, a gauge by reason and topic, and readiness degraded meanwhile
(`relay.OutboxRelay` keeps the state; this module decides).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Final

from pin_runtime.delivery import DeliveryFailure

__all__ = ["TOPIC_REFUSALS", "Pause", "next_pause", "refusal_of"]

TOPIC_REFUSALS: Final = frozenset({"topic-authorization", "unknown-topic", "partition-count"})
"""Reasons that are one topic's: only an acknowledgement of that topic lifts them. The others
(authentication, cluster authorization) are the client's: any acknowledgement does."""


@dataclass(frozen=True, slots=True)
class Pause:
    """What the cluster refused, on which row, since when (monotonic seconds)."""

    failure: DeliveryFailure
    topic: str
    """The topic of the first row refused (for a refusal of the client: where it showed)."""
    outbox_id: int
    since: float

    def same_refusal(self, other: Pause) -> bool:
        # By reason, not code: librdkafka answers a missing topic with the broker's
        # UNKNOWN_TOPIC_OR_PART first and its own _UNKNOWN_TOPIC from cached metadata after,
        # one refusal that must not be announced again at every retry.
        return (self.failure.reason, self.topic) == (other.failure.reason, other.topic)

    def lifted_by(self, acknowledged: Collection[str]) -> bool:
        """Whether acknowledgements of rows of these topics show the refusal is gone."""
        if self.failure.reason in TOPIC_REFUSALS:
            return self.topic in acknowledged
        return bool(acknowledged)

    def describe(self) -> str:
        """One line for readiness: what the cluster refuses, on which topic."""
        return f"refused by the cluster: {self.failure} (topic {self.topic})"


def refusal_of(
    stop: DeliveryFailure | None, client: DeliveryFailure | None
) -> DeliveryFailure | None:
    """The cluster-wide refusal that stopped a flow, if it was one.

    `stop`: the failure of the first row that waits (None: it had no outcome at all);
    `client`: a cluster-wide refusal the producer reported for itself meanwhile. The row's
    own failure decides when it names the cluster; a row that only timed out while the
    client was refused its credentials was refused too (an authentication failure reaches
    the records as timeouts, never as their own error).
    """
    if stop is not None and stop.cluster_wide:
        return stop
    if client is not None and client.cluster_wide and (stop is None or stop.retriable):
        return client
    return None


def next_pause(
    current: Pause | None,
    refused: Pause | None,
    *,
    acknowledged: Collection[str],
    idle: bool,
) -> Pause | None:
    """The relay's pause after a round.

    `refused`: the round stopped on a cluster-wide refusal (a pause that is already on for
    the same refusal keeps its start). Otherwise the pause ends once Kafka acknowledged a
    row it lifts (`acknowledged`: topics of rows acknowledged in the round) or when nothing
    waits any more (`idle`); an outage, or acknowledgements still pending, change nothing.
    """
    if refused is not None:
        if current is not None and current.same_refusal(refused):
            return current
        return refused
    if current is not None and (idle or current.lifted_by(acknowledged)):
        return None
    return current
