"""Prometheus metrics of the outbox relay (names under `identity_outbox_`).

Each metric is declared once, as an attribute of `RelayMetrics`, which also keeps the
gauges that follow the relay's state. A counter's name may end in `_total` or not: it is
exported with `_total`.
"""

from __future__ import annotations

from collections.abc import Mapping

from pin_contracts.topics import CATALOGUE
from pin_runtime.delivery import NON_RETRIABLE
from pin_runtime.metrics import MetricSet, counter, gauge

__all__ = ["RelayMetrics"]


class RelayMetrics(MetricSet):
    """The relay's metrics on the given registry (never the process-global default)."""

    backlog = gauge(
        "identity_outbox_backlog",
        "Outbox rows waiting to be published (exact up to 10000, then the id span); "
        "NaN while this instance cannot read the database.",
    )
    oldest_age_seconds = gauge(
        "identity_outbox_oldest_age_seconds",
        "Age of the next row to publish (lowest id); 0 when the outbox is empty; "
        "NaN while this instance cannot read the database.",
    )
    writer_oldest_age_seconds = gauge(
        "identity_outbox_writer_oldest_age_seconds",
        "How long the oldest open transaction holding a writer lock of a slot this instance "
        "publishes has held it, from this instance's first look that found it (rows of that "
        "slot committed since wait for it to end); 0 when none; NaN while this instance "
        "cannot read the database.",
    )
    published = counter(
        "identity_outbox_published_total",
        "Outbox rows acknowledged by the broker and deleted.",
    )
    delivery_failures = counter(
        "identity_outbox_delivery_failures_total",
        "Stops of the relay's flow on a failed delivery: 1 each time the flow stops on a row "
        "the broker refused (retriably, or for the cluster) or did not acknowledge in time; "
        "the rows behind it, sent again with it, are not counted. A fault held for N retries "
        "counts N, whatever the window.",
    )
    relay_active = gauge(
        "identity_outbox_relay_active",
        "1 while this instance holds at least one outbox lane and publishes, 0 otherwise.",
    )
    lanes_held = gauge(
        "identity_outbox_lanes_held",
        "Outbox lanes this instance holds (publishes); summed over instances: the lane count.",
    )
    in_flight = gauge(
        "identity_outbox_in_flight",
        "Records this instance produced and has not settled yet (its in-flight window).",
    )
    quarantined = counter(
        "identity_outbox_quarantined_total",
        "Outbox rows Kafka or the client refused for good, moved to the quarantine.",
        labels=("topic", "reason"),
    )
    quarantine_rows = gauge(
        "identity_outbox_quarantine_rows",
        "Rows in identity.outbox_quarantine now, by topic (each needs an operator).",
        labels=("topic",),
    )
    paused = gauge(
        "identity_outbox_relay_paused",
        "1 while this instance holds its rows because the cluster refuses it (not authorized, "
        "not authenticated, no such topic), by reason and topic.",
        labels=("reason", "topic"),
    )
    foreign_lock_holders = gauge(
        "identity_outbox_foreign_lock_holders",
        "Sessions of logins that are no relay's holding outbox lane locks (their slots stay "
        "unpublished while they do), as this instance last saw them.",
    )
    topic_partitions = gauge(
        "identity_outbox_topic_partitions",
        "Partitions of each topic the relay publishes, as its last look at the cluster's "
        "metadata saw them (0: no such topic); records are pinned to the topic catalogue's "
        "count.",
        labels=("topic",),
    )
    database_auth_failures = counter(
        "identity_outbox_database_auth_failures_total",
        "Rounds of this instance that failed because PostgreSQL refused its login (SQLSTATE "
        "28P01 invalid_password, 28000 invalid_authorization_specification): a rotated "
        "password or a wrong secret; the relay retries with backoff.",
    )

    def __post_init__(self) -> None:
        # Each reason a row is refused for good, on each event topic identity writes, is
        # exported from the start (at 0), as the worker's outcomes are: the first
        # quarantined row is an increase, not a series that appears with it.
        for topic in (t.name for t in CATALOGUE if t.dead_letter_of is None):
            for reason in sorted(set(NON_RETRIABLE.values())):
                self.quarantined.labels(topic=topic, reason=reason)
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
        self.writer_oldest_age_seconds.set(nan)
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
