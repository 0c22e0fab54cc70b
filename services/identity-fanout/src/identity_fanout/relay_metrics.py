"""Prometheus metrics of the outbox relay (names under `identity_outbox_`)."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["RelayMetrics"]


class RelayMetrics:
    """The relay's metrics on the given registry (never the process-global default)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.backlog = Gauge(
            "identity_outbox_backlog",
            "Outbox rows waiting to be published (exact up to 10000, then the id span).",
            registry=registry,
        )
        self.oldest_age_seconds = Gauge(
            "identity_outbox_oldest_age_seconds",
            "Age of the next row to publish (lowest id); 0 when the outbox is empty.",
            registry=registry,
        )
        self.published = Counter(
            "identity_outbox_published_total",
            "Outbox rows acknowledged by the broker and deleted.",
            registry=registry,
        )
        self.delivery_failures = Counter(
            "identity_outbox_delivery_failures_total",
            "Records of a round the broker did not acknowledge; their rows are retried.",
            registry=registry,
        )
        self.relay_active = Gauge(
            "identity_outbox_relay_active",
            "1 while this instance holds at least one outbox lane and publishes, 0 otherwise.",
            registry=registry,
        )
        self.lanes_held = Gauge(
            "identity_outbox_lanes_held",
            "Outbox lanes this instance holds (publishes); summed over instances: the lane count.",
            registry=registry,
        )
        self.in_flight = Gauge(
            "identity_outbox_in_flight",
            "Records this instance produced and has not settled yet (its in-flight window).",
            registry=registry,
        )
        self.quarantined = Counter(
            "identity_outbox_quarantined_total",
            "Outbox rows Kafka or the client refused for good, moved to the quarantine.",
            ["topic", "reason"],
            registry=registry,
        )
        self.quarantine_rows = Gauge(
            "identity_outbox_quarantine_rows",
            "Rows in identity.outbox_quarantine now, by topic (each needs an operator).",
            ["topic"],
            registry=registry,
        )
        self._quarantine_topics: set[str] = set()

    def set_lanes(self, lanes: frozenset[int]) -> None:
        self.lanes_held.set(len(lanes))
        self.relay_active.set(1 if lanes else 0)

    def set_quarantine_rows(self, by_topic: Mapping[str, int]) -> None:
        """Counts per topic; a topic whose rows were all retried goes back to 0."""
        self._quarantine_topics.update(by_topic)
        for topic in self._quarantine_topics:
            self.quarantine_rows.labels(topic=topic).set(by_topic.get(topic, 0))
