"""The worker's and the relay's labelled counters are exported from the start, at 0, for
every label value they can take: an alert or a rate on their increase sees the first event,
not a series that appears with it."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from identity_fanout.fanout.metrics import FanoutMetrics
from identity_fanout.outbox.metrics import RelayMetrics
from pin_runtime.metrics import MetricSet

OUTCOMES = ("completed", "failed", "lease_lost", "released", "superseded")
REFUSED_FOR_GOOD = ("too-large", "invalid-record", "invalid-topic")
EVENT_TOPICS = ("pin.identity.access.v1", "pin.identity.agent-membership-changed.v1")

KNOWN_SERIES = {
    "identity_access_fanout_errors_total": [
        {"kind": kind} for kind in ("batch", "outage", "poll", "lease_lost", "poison")
    ],
    "identity_access_fanout_tasks_total": [{"outcome": o} for o in OUTCOMES],
    "identity_access_fanout_shards_total": [{"outcome": o} for o in OUTCOMES],
    "identity_outbox_quarantined_total": [
        {"topic": topic, "reason": reason} for topic in EVENT_TOPICS for reason in REFUSED_FOR_GOOD
    ],
}


def test_a_fresh_registry_shows_every_known_series_of_each_labelled_counter_at_0() -> None:
    registry = CollectorRegistry()
    sets: list[MetricSet] = [FanoutMetrics(registry), RelayMetrics(registry)]
    for name, series in KNOWN_SERIES.items():
        for labels in series:
            assert registry.get_sample_value(name, labels) == 0.0, (name, labels)
    labelled = {
        spec.name.removesuffix("_total") + "_total"
        for metric_set in sets
        for _, spec in type(metric_set)._declared
        if spec.kind is Counter and spec.labels
    }
    assert labelled == set(KNOWN_SERIES)
