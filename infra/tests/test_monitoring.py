"""Alerts and dashboards name only metrics the services export, and every alert of the specs
is there with its severity, summary, description and runbook page.

Exported names come from the services' own metric classes registered on a fresh registry, so
a renamed metric fails here before a dashboard goes blank in production.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from identity_fanout.fanout.metrics import FanoutMetrics
from identity_fanout.outbox.relay import RelayMetrics
from pin_runtime.build import BuildInfo, register_process_metrics
from pin_runtime.horizon import HorizonMetrics
from pin_runtime.lag_watch.metrics import LagWatchMetrics
from pin_runtime.metrics import MetricSet
from rewards_membership.metrics import Metrics as MembershipMetrics

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "infra" / "monitoring"
SERVICES = ("identity-fanout", "rewards-membership")

# The specs' alerts (000: AccessFanOutJob "Alerts"; 004: membership consumer "Alerts").
SPEC_ALERTS = {
    "identity-fanout": {
        "IdentityFanoutQueueBacklogHigh": "identity_access_fanout_queue_backlog",
        "IdentityFanoutErrorsGrowing": "identity_access_fanout_errors_total",
        "IdentityFanoutTaskFailed": "identity_access_fanout_failed_tasks",
        "IdentityOutboxBacklogHigh": "identity_outbox_backlog",
        "IdentityOutboxStalled": "identity_outbox_oldest_age_seconds",
        "IdentityOutboxQuarantined": "identity_outbox_quarantine_rows",
        "IdentityAccessTopicBacklogHigh": "kafka_consumergroup_lag",
        "IdentityFanoutNoSuccessfulRun": "identity_access_fanout_last_success_timestamp_seconds",
    },
    "rewards-membership": {
        "RewardsMembershipLagHigh": "kafka_consumergroup_lag_seconds",
        "RewardsMembershipConsumerStalled": "rewards_identity_membership_consumer_lag",
        "RewardsMembershipDeadLetters": "rewards_identity_membership_dlq_total",
        "RewardsMembershipPartitionPaused": "rewards_membership_partition_paused_seconds",
    },
}

# The alerts that make the ones above fail loudly instead of going quiet: a lag source that
# does not report, a process kind that no longer reports, a lag watcher that cannot read.
GUARD_ALERTS = {
    "identity-fanout": {
        "IdentityAccessTopicLagUnreported": "kafka_consumergroup_lag",
        "IdentityLagWatcherDown": "pin_lag_watcher_last_success_timestamp_seconds",
        "IdentityFanoutWorkerAbsent": "identity_access_fanout_queue_backlog",
        "IdentityOutboxRelayAbsent": "identity_outbox_relay_active",
    },
    "rewards-membership": {
        "RewardsMembershipLagUnreported": "kafka_consumergroup_lag_seconds",
        "RewardsMembershipConsumerAbsent": "rewards_membership_paused_partitions",
        "RewardsMembershipLagWatcherDown": "pin_lag_watcher_last_success_timestamp_seconds",
    },
}
# Alerts for failures the specs do not name: the cluster refusing the relay (ACLs,
# credentials, a missing topic) holds every event, where a quarantine holds one. Membership
# records keyed other than by their AgentUserId break the spec's per-agent order.
OWN_ALERTS: dict[str, dict[str, str]] = {
    "identity-fanout": {
        "IdentityOutboxRelayRefused": "identity_outbox_relay_paused",
        "IdentityFanoutTaskWaiting": "identity_access_fanout_oldest_waiting_seconds",
        "IdentityOutboxForeignLaneLocks": "identity_outbox_foreign_lock_holders",
        "IdentityPostgresHorizonHeld": "pin_postgres_oldest_xmin_age_seconds",
        "IdentityDatabaseAuthFailed": "identity_outbox_database_auth_failures_total",
        "IdentityAccessTopicPartitionsChanged": "pin_lag_watcher_topic_partitions",
    },
    "rewards-membership": {
        "RewardsMembershipKeyMismatch": "rewards_membership_key_mismatch_total",
        "RewardsMembershipPartitionLocked": "rewards_membership_paused_partitions_by_reason",
        "RewardsMembershipPostgresHorizonHeld": "pin_postgres_oldest_xmin_age_seconds",
        "RewardsMembershipTopicPartitionsChanged": "pin_lag_watcher_topic_partitions",
        "RewardsMembershipAuthFailed": "rewards_membership_auth_failures_total",
    },
}
ALERTS = {
    service: SPEC_ALERTS[service] | GUARD_ALERTS[service] | OWN_ALERTS[service]
    for service in SPEC_ALERTS
}

# Metrics of other exporters that a service's alerts rely on (documented in the rule comment
# and the runbook): danielqsj/kafka_exporter's topic metadata, which says that an exporter
# watches the access topic instead of the lag watcher.
EXTERNAL_METRICS = {"identity-fanout": {"kafka_topic_partitions"}}

# No `_created`: the services do not export it (pin_runtime.metrics), so no rule may read it.
_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_sum", "_count"),
    "gauge": ("",),
    "info": ("_info",),
}


def service_registry(service: str) -> tuple[CollectorRegistry, list[MetricSet]]:
    """A registry with every metric the service's processes register, and its metric sets."""
    registry = CollectorRegistry()
    # Every long-running command's process and build metrics (`pin_runtime.build`).
    register_process_metrics(registry, BuildInfo.of(service))
    sets: list[MetricSet] = [
        LagWatchMetrics(registry),  # `<service> lag-watch`, in each chart
        HorizonMetrics(registry),  # every long-running process of both services
    ]
    if service == "identity-fanout":
        sets += [FanoutMetrics(registry), RelayMetrics(registry)]
    else:
        sets.append(MembershipMetrics(registry))
    return registry, sets


def exported_names(service: str) -> set[str]:
    """Every sample name the service can export, including labelled series not yet used."""
    registry, _ = service_registry(service)
    names: set[str] = set()
    for family in registry.collect():
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names | EXTERNAL_METRICS.get(service, set())


@pytest.mark.parametrize("service", SERVICES)
def test_no_counter_or_histogram_exports_a_created_series(service: str) -> None:
    registry, sets = service_registry(service)
    # Every counter and histogram with a series (a labelled one: a child of made-up labels),
    # each moved once: `_created` would stand beside each of them.
    for metric_set in sets:
        for attribute, spec in type(metric_set)._declared:
            metric = getattr(metric_set, attribute)
            child = metric.labels(*("x" for _ in spec.labels)) if spec.labels else metric
            if isinstance(child, Counter):
                child.inc()
            elif isinstance(child, Histogram):
                child.observe(1.0)
    for text in (
        generate_latest(registry).decode(),
        # The format a scrape may ask for.
        openmetrics_latest(registry).decode(),  # type: ignore[no-untyped-call]
    ):
        assert "_total" in text
        assert "_bucket" in text
        assert "_created" not in text, [line for line in text.splitlines() if "_created" in line]


# PromQL words that are not metric names, and the parts of an expression that hold none.
_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool"}
    | {"and", "or", "unless", "atan2", "inf", "nan"}
)
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(
    r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", re.IGNORECASE
)
_OFFSET = re.compile(r"\boffset\s+-?[0-9a-z]+", re.IGNORECASE)
_IDENTIFIER = re.compile(r"(?<![\w$.])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()")


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (functions, labels, keywords left out)."""
    text = _STRINGS.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _RANGES.sub("", text)
    text = _GROUPING.sub("", text)
    text = _OFFSET.sub("", text)
    return {name for name in _IDENTIFIER.findall(text) if name.lower() not in _KEYWORDS}


def test_metric_names_parser() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le) (rate(a_bucket{namespace="$ns", x=~"b|c"}'
        "[$__rate_interval]))) / on (namespace) group_left (kind) max without (pod) (b_total"
        ' offset 5m) > bool 3 or absent(c) unless time() - d{k="by"} and label_replace(e, '
        '"dst", "$1", "src", "(.*)")'
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "c", "d", "e"}


def rule_files() -> dict[str, dict[str, Any]]:
    return {
        service: yaml.safe_load((MONITORING / "rules" / f"{service}.rules.yml").read_text())
        for service in SERVICES
    }


def alerting_rules(service: str) -> Iterator[dict[str, Any]]:
    for group in rule_files()[service]["groups"]:
        yield from (rule for rule in group["rules"] if "alert" in rule)


# Panels that follow events past the service's own pods, and the services whose metrics they
# read besides its own: identity-fanout's "Across services" row shows what rewards-membership
# consumed of what the relays published.
EVENTS_PANEL = "Events per second: written, published, consumed"
ACROSS_SERVICES = {"identity-fanout": {EVENTS_PANEL: ("rewards-membership",)}}


def load_dashboard(service: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((MONITORING / "dashboards" / f"{service}.json").read_text())
    return loaded


def dashboard_exprs(service: str) -> list[tuple[str, str]]:
    dashboard = load_dashboard(service)
    found = [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict) and "label_values(" in query["query"]:
            inner = query["query"].split("label_values(", 1)[1].rsplit(",", 1)[0]
            found.append((f"variable {variable['name']}", inner))
    return found


@pytest.mark.parametrize("service", SERVICES)
def test_dashboard_exprs_reference_exported_metrics(service: str) -> None:
    exported = exported_names(service)
    exprs = dashboard_exprs(service)
    assert len(exprs) >= 10
    for title, expr in exprs:
        names = metric_names(expr)
        assert names, f"{title}: no metric in {expr!r}"
        others = ACROSS_SERVICES.get(service, {}).get(title, ())
        allowed = exported.union(*(exported_names(other) for other in others))
        assert names <= allowed, f"{title}: {sorted(names - allowed)} not exported by {service}"


def test_the_events_panel_shows_each_step_it_names() -> None:
    """Written by the fan-out, published by the relays, consumed by rewards-membership: one
    query each, the last on the consumer's own count of committed messages."""
    exprs = [expr for title, expr in dashboard_exprs("identity-fanout") if title == EVENTS_PANEL]
    assert [metric_names(expr) for expr in exprs] == [
        {"identity_access_fanout_users_total"},
        {"identity_outbox_published_total"},
        {"rewards_membership_consume_duration_ms_count"},
    ]
    assert "rewards_membership_consume_duration_ms_count" in exported_names("rewards-membership")


_CHART_VALUE = re.compile(r"the chart's ([a-zA-Z][\w.]*[a-zA-Z])")


@pytest.mark.parametrize("service", SERVICES)
def test_chart_values_named_by_panels_exist(service: str) -> None:
    values = yaml.safe_load((ROOT / "infra" / "helm" / service / "values.yaml").read_text())
    named = [
        (panel["title"], key)
        for panel in load_dashboard(service)["panels"]
        for text in (panel["title"], panel.get("description", ""))
        for key in _CHART_VALUE.findall(text)
    ]
    assert named
    for title, key in named:
        node = values
        for part in key.split("."):
            assert isinstance(node, dict), f"{title}: {key} is not a value of the chart"
            assert part in node, f"{title}: {key} is not a value of the chart"
            node = node[part]


@pytest.mark.parametrize("service", SERVICES)
def test_dashboard_shows_every_spec_metric(service: str) -> None:
    shown = {name for _, expr in dashboard_exprs(service) for name in metric_names(expr)}
    for metric in SPEC_ALERTS[service].values():
        assert metric in shown or f"{metric}_bucket" in shown


@pytest.mark.parametrize("service", SERVICES)
def test_dashboard_is_importable_json(service: str) -> None:
    dashboard = load_dashboard(service)
    assert dashboard["uid"] == f"pin-{service}"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


@pytest.mark.parametrize("service", SERVICES)
def test_alert_exprs_reference_exported_metrics(service: str) -> None:
    exported = exported_names(service)
    for rule in alerting_rules(service):
        names = metric_names(rule["expr"])
        assert names, rule["alert"]
        assert names <= exported, f"{rule['alert']}: {sorted(names - exported)} not exported"


@pytest.mark.parametrize("service", SERVICES)
def test_every_spec_alert_is_defined_on_its_metric(service: str) -> None:
    rules = {rule["alert"]: rule for rule in alerting_rules(service)}
    assert set(rules) == set(ALERTS[service])
    for alert, metric in ALERTS[service].items():
        assert metric in metric_names(rules[alert]["expr"]), alert


@pytest.mark.parametrize("service", SERVICES)
def test_alerts_carry_severity_summary_description_and_runbook(service: str) -> None:
    for rule in alerting_rules(service):
        alert = rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}, alert
        assert rule["labels"]["service"] == service, alert
        annotations = rule["annotations"]
        assert annotations["summary"].strip(), alert
        assert annotations["description"].strip(), alert
        assert annotations["runbook_url"] == f"docs/runbooks/{alert}.md"
        page = ROOT / annotations["runbook_url"]
        assert page.is_file(), f"{alert}: no runbook page {page}"
        assert page.read_text().startswith(f"# {alert}\n"), page


# Runbook pages of procedures rather than alerts (the specs name them).
PROCEDURES = {"rewards-agent-performance-rebuild"}


def test_every_runbook_page_belongs_to_an_alert_or_a_procedure() -> None:
    alerts = {alert for by_service in ALERTS.values() for alert in by_service}
    pages = {path.stem for path in (ROOT / "docs" / "runbooks").glob("*.md")}
    assert pages - {"README"} == alerts | PROCEDURES
    for procedure in PROCEDURES:
        page = ROOT / "docs" / "runbooks" / f"{procedure}.md"
        assert page.read_text().startswith(f"# {procedure}\n")
        assert f"({procedure}.md)" in (ROOT / "docs" / "runbooks" / "README.md").read_text()


@pytest.mark.parametrize("service", SERVICES)
def test_chart_embeds_the_same_rules(service: str) -> None:
    source = MONITORING / "rules" / f"{service}.rules.yml"
    copy = ROOT / "infra" / "helm" / service / "files" / "prometheus-rules.yml"
    assert copy.read_bytes() == source.read_bytes(), "run infra/checks/monitoring.sh --fix"
