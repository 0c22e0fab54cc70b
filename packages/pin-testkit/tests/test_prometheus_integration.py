"""The real Prometheus server scrapes a live /metrics and fires an alert of a rule file."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from pin_testkit.local.prometheus import PrometheusServer, repository_rule_files
from pin_testkit.waiting import wait_until

# Real servers started here (Toxiproxy, a private broker, Prometheus): not a unit test.
pytestmark = pytest.mark.integration

RULES = """
groups:
  - name: probe
    rules:
      - alert: ProbeAboveZero
        expr: max by (namespace) (pin_probe_value) > 0
        labels: {severity: warning}
        annotations: {summary: probe}
"""


def test_alert_fires_from_a_scraped_metric_and_resolves(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    probe = Gauge("pin_probe_value", "A value the test sets", registry=registry)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    rules = tmp_path / "probe.rules.yml"
    rules.write_text(RULES)
    try:
        with PrometheusServer(tmp_path / "prom", rule_files=[rules]) as prometheus:
            prometheus.scrape("probe", f"127.0.0.1:{server.server_port}")
            wait_until(lambda: prometheus.targets_up() == 1, 30, "target scraped", interval=0.2)
            assert prometheus.firing() == set()
            probe.set(3)
            wait_until(
                lambda: prometheus.firing() == {"ProbeAboveZero"}, 30, "alert firing", interval=0.2
            )
            [sample] = prometheus.query("pin_probe_value")
            assert sample["metric"]["namespace"] == "pin-e2e"
            probe.set(0)
            wait_until(lambda: prometheus.firing() == set(), 30, "alert resolved", interval=0.2)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_the_repository_rules_load(tmp_path: Path) -> None:
    files = repository_rule_files()
    assert {f.name for f in files} >= {"identity-fanout.rules.yml", "rewards-membership.rules.yml"}
    with PrometheusServer(tmp_path / "prom") as prometheus:
        # Loaded rules answer in the rules API; a broken file would have stopped the start.
        groups = prometheus._api("rules")["groups"]
        assert {g["name"] for g in groups} >= {"identity-fanout", "rewards-membership"}
