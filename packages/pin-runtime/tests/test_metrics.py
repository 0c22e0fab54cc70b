from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from pin_runtime.metrics import MetricDeclarations


def test_metrics_are_declared_on_the_given_registry_with_their_labels_and_buckets() -> None:
    registry = CollectorRegistry()
    m = MetricDeclarations(registry)
    errors = m.counter("svc_errors", "Failures by kind.", "kind")
    backlog = m.gauge("svc_backlog", "Rows waiting.")
    size = m.histogram("svc_size", "Users per task.", (1, 10), "outcome")

    errors.labels(kind="poll").inc()
    backlog.set(3)
    size.labels(outcome="done").observe(5)

    text = generate_latest(registry).decode()
    assert 'svc_errors_total{kind="poll"} 1.0' in text
    assert "svc_backlog 3.0" in text
    assert 'svc_size_bucket{le="10.0",outcome="done"} 1.0' in text
    assert "# HELP svc_backlog Rows waiting." in text
    assert REGISTRY.get_sample_value("svc_backlog") is None  # never the global registry
