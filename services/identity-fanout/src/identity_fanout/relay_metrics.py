"""Prometheus metrics of the outbox relay (names under `identity_outbox_`)."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry

from pin_runtime.metrics import MetricDeclarations

__all__ = ["RelayMetrics"]


class RelayMetrics:
    """The relay's metrics on the given registry (never the process-global default)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        m = MetricDeclarations(registry)
        self.backlog = m.gauge(
            "identity_outbox_backlog",
            "Outbox rows waiting to be published (exact up to 10000, then the id span).",
        )
        self.oldest_age_seconds = m.gauge(
            "identity_outbox_oldest_age_seconds",
            "Age of the next row to publish (lowest id); 0 when the outbox is empty.",
        )
        self.published = m.counter(
            "identity_outbox_published_total", "Outbox rows acknowledged by the broker and deleted."
        )
        self.delivery_failures = m.counter(
            "identity_outbox_delivery_failures_total",
            "Records of a round the broker did not acknowledge; their rows are retried.",
        )
        self.relay_active = m.gauge(
            "identity_outbox_relay_active",
            "1 while this instance holds at least one outbox lane and publishes, 0 otherwise.",
        )
        self.lanes_held = m.gauge(
            "identity_outbox_lanes_held",
            "Outbox lanes this instance holds (publishes); summed over instances: the lane count.",
        )
        self.in_flight = m.gauge(
            "identity_outbox_in_flight",
            "Records this instance produced and has not settled yet (its in-flight window).",
        )
        self.quarantined = m.counter(
            "identity_outbox_quarantined_total",
            "Outbox rows Kafka or the client refused for good, moved to the quarantine.",
            "topic",
            "reason",
        )
        self.quarantine_rows = m.gauge(
            "identity_outbox_quarantine_rows",
            "Rows in identity.outbox_quarantine now, by topic (each needs an operator).",
            "topic",
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
