"""Prometheus metrics of the outbox relay (names under `identity_outbox_`).

Each metric is declared once, in `metrics.toml` next to this module; `RelayMetrics`
gives each its typed attribute and keeps the gauges that follow the relay's state.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import Counter, Gauge

from pin_runtime.metrics import MetricSet, load_catalogue

__all__ = ["RelayMetrics"]


class RelayMetrics(MetricSet):
    """The relay's metrics on the given registry (never the process-global default)."""

    catalogue = load_catalogue("identity_fanout", "outbox/metrics.toml")

    backlog: Gauge
    oldest_age_seconds: Gauge
    published: Counter
    delivery_failures: Counter
    relay_active: Gauge
    lanes_held: Gauge
    in_flight: Gauge
    quarantined: Counter
    quarantine_rows: Gauge
    paused: Gauge
    foreign_lock_holders: Gauge
    database_auth_failures: Counter
    topic_partitions: Gauge

    def __post_init__(self) -> None:
        self._quarantine_topics: set[str] = set()
        self._paused: tuple[str, str] | None = None

    def set_paused(self, refusal: tuple[str, str] | None) -> None:
        """1 for the (reason, topic) the relay is paused for, 0 for the one before."""
        if self._paused is not None and self._paused != refusal:
            self.paused.labels(reason=self._paused[0], topic=self._paused[1]).set(0)
        if refusal is not None:
            self.paused.labels(reason=refusal[0], topic=refusal[1]).set(1)
        self._paused = refusal

    def set_unknown(self) -> None:
        """The gauges read from the database, NaN while this instance cannot read it.

        NaN, not the last value nor no series: a last value of 0 read as an empty outbox
        while nothing was looked at, and a removed series looks like a relay that is not
        running; NaN keeps the series (the relay runs) and says it cannot see. `max` over
        instances skips NaN, so one instance that sees still decides the alerts, and the
        stall alert pages for a blind relay itself (`x != x`)."""
        nan = float("nan")
        self.backlog.set(nan)
        self.oldest_age_seconds.set(nan)
        self.foreign_lock_holders.set(nan)
        for topic in self._quarantine_topics:
            self.quarantine_rows.labels(topic=topic).set(nan)

    def set_topic_partitions(self, topic: str, count: int) -> None:
        self.topic_partitions.labels(topic=topic).set(count)

    def set_lanes(self, lanes: frozenset[int]) -> None:
        self.lanes_held.set(len(lanes))
        self.relay_active.set(1 if lanes else 0)

    def set_quarantine_rows(self, by_topic: Mapping[str, int]) -> None:
        """Counts per topic; a topic whose rows were all retried goes back to 0."""
        self._quarantine_topics.update(by_topic)
        for topic in self._quarantine_topics:
            self.quarantine_rows.labels(topic=topic).set(by_topic.get(topic, 0))
