"""The consumer's labelled counters are exported from the start, at 0, for every label value
they can take (the spec's `{status}` Active/Left, its one dead-letter code, ...): an alert or
a rate on their increase sees the first event, not a series that appears with it."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest

from rewards_membership.metrics import Metrics

KNOWN_SERIES = {
    "rewards_membership_applied_total": [{"status": "Active"}, {"status": "Left"}],
    "rewards_identity_membership_dlq_total": [{"code": "REWARDS_MEMBERSHIP_EVENT_INVALID"}],
    "rewards_contract_mismatch_total": [
        *({"contract_version": str(v)} for v in range(2, 17)),
        {"contract_version": "other"},
    ],
    "rewards_membership_key_mismatch_total": [
        {"reason": "missing"},
        {"reason": "not_utf8"},
        {"reason": "not_agent_user_id"},
    ],
    "rewards_membership_retries_total": [{"dependency": "postgresql"}, {"dependency": "kafka"}],
    "rewards_identity_membership_dlq_replaced_total": [
        {"reason": "too-large"},
        {"reason": "invalid-record"},
        {"reason": "invalid-topic"},
    ],
    "rewards_membership_auth_failures_total": [
        {"dependency": "postgresql"},
        {"dependency": "kafka"},
    ],
}


def test_a_fresh_registry_shows_every_known_series_of_each_labelled_counter_at_0() -> None:
    registry = CollectorRegistry()
    Metrics(registry)
    for name, series in KNOWN_SERIES.items():
        for labels in series:
            assert registry.get_sample_value(name, labels) == 0.0, (name, labels)
    # In the scrape itself, before any event.
    text = generate_latest(registry).decode()
    assert 'rewards_membership_applied_total{status="Left"} 0.0' in text
    assert 'dlq_total{code="REWARDS_MEMBERSHIP_EVENT_INVALID"} 0.0' in text
    # The expected ContractVersion is never a mismatch: no series of its own.
    expected = {"contract_version": "1"}
    assert registry.get_sample_value("rewards_contract_mismatch_total", expected) is None


def test_every_labelled_counter_is_among_them() -> None:
    metrics = Metrics(CollectorRegistry())
    labelled = {
        spec.name.removesuffix("_total") + "_total"
        for _, spec in type(metrics)._declared
        if spec.kind is Counter and spec.labels
    }
    assert labelled == set(KNOWN_SERIES)
