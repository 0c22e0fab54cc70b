"""The charts render what the services read: every setting, secrets only by reference, and a
configuration the service's own settings loader accepts. No cluster: `helm template` only
(Helm from infra/checks/tools.sh, built once into the per-user tools cache).
"""

from __future__ import annotations

import builtins
import io
import re
import shutil
import socket
import subprocess
import urllib.error
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
import yaml
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from identity_fanout.settings import ENV_PREFIX as IDENTITY_PREFIX
from identity_fanout.settings import LagWatchSettings as IdentityLagWatchSettings
from identity_fanout.settings import Settings as IdentitySettings
from pin_runtime.settings import load_settings
from pin_runtime.tracing import RedactingExporter, configure_tracing, shutdown_tracing
from rewards_membership.settings import ENV_PREFIX as REWARDS_PREFIX
from rewards_membership.settings import LagWatchSettings as RewardsLagWatchSettings
from rewards_membership.settings import Settings as RewardsSettings

ROOT = Path(__file__).resolve().parents[2]
CHARTS = ROOT / "infra" / "helm"
# The library chart both charts depend on (file://../pin-common): the templates they share.
LIBRARY = "pin-common"
SETTINGS: dict[str, tuple[type[msgspec.Struct], str]] = {
    "identity-fanout": (IdentitySettings, IDENTITY_PREFIX),
    "rewards-membership": (RewardsSettings, REWARDS_PREFIX),
}
# `<service> lag-watch`: settings of its own, under the service's prefix (no database).
LAG_WATCH_SETTINGS: dict[str, type[msgspec.Struct]] = {
    "identity-fanout": IdentityLagWatchSettings,
    "rewards-membership": RewardsLagWatchSettings,
}
LAG_WATCHER = "lag-watcher"
SECRET_SETTINGS = {
    "DATABASE_DSN",
    "KAFKA_SASL_USERNAME",
    "KAFKA_SASL_PASSWORD",
    "KAFKA_SSL_KEY_PASSWORD",
}
# Paths of password files, set in a pod's env only when its values mount the Secret there.
FILE_SETTINGS = {"DATABASE_PASSWORD_FILE", "KAFKA_SASL_PASSWORD_FILE"}
VALUES = ("default", "production")
# The sidecar ci/production-values.yaml adds to every Deployment (extraContainers).
SIDECARS = {"log-shipper"}
KUBE_VERSION = "1.37.0"

pytestmark = pytest.mark.timeout(900)  # a first run builds Helm from the Go module proxy


@cache
def helm() -> str:
    return subprocess.run(
        [str(ROOT / "infra" / "checks" / "tools.sh"), "helm"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def build_dependencies(path: Path) -> None:
    """The chart's charts/: its library chart packaged from the same tree, before every render
    (nothing is kept or reused, so an edit of the library is what renders). A failure fails
    the test as itself, not as the refused value a test may expect."""
    command = [helm(), "dependency", "build", "--skip-refresh", str(path)]
    done = subprocess.run(command, check=False, capture_output=True, text=True)
    if done.returncode:
        pytest.fail(f"helm dependency build {path}: {done.stderr}")


def render(
    chart: str,
    values: str = "default",
    *sets: str,
    charts: Path = CHARTS,
    release: str | None = None,
    files: tuple[Path, ...] = (),
) -> list[dict[str, Any]]:
    """`helm template` of the chart: `values` "default", or "production" / "overlay" (its
    ci/<values>-values.yaml), then `files` (-f) and `sets` (--set) in that order."""
    build_dependencies(charts / chart)
    command = [helm(), "template", release or chart, str(charts / chart), "--namespace", "pin"]
    command += ["--kube-version", KUBE_VERSION]
    if values != "default":
        command += ["-f", str(charts / chart / "ci" / f"{values}-values.yaml")]
    for file in files:
        command += ["-f", str(file)]
    for setting in sets:
        command += ["--set", setting]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


def configmap(docs: list[dict[str, Any]], chart: str, suffix: str = "") -> dict[str, Any]:
    """The service's ConfigMap (named like the release, as the tests render it), or the
    lag watcher's (`suffix` "-lag-watcher")."""
    (found,) = [
        doc for doc in of_kind(docs, "ConfigMap") if doc["metadata"]["name"] == chart + suffix
    ]
    return found


def service(docs: list[dict[str, Any]], chart: str, suffix: str = "-metrics") -> dict[str, Any]:
    """The metrics Service (scraped by the ServiceMonitor), or `helm test`'s (`suffix` "-pods")."""
    (found,) = [
        doc for doc in of_kind(docs, "Service") if doc["metadata"]["name"] == chart + suffix
    ]
    return found


def containers(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The service's own containers (not the sidecars of extraContainers)."""
    for doc in docs:
        if doc["kind"] in {"Deployment", "Job"}:
            for container in doc["spec"]["template"]["spec"]["containers"]:
                if container["name"] not in SIDECARS:
                    yield doc["metadata"]["name"], container


def secret_refs(container: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {
        env["name"]: env["valueFrom"]["secretKeyRef"]
        for env in container.get("env", [])
        if "secretKeyRef" in env.get("valueFrom", {})
    }


def test_both_charts_take_their_helpers_from_the_library_chart() -> None:
    library = yaml.safe_load((CHARTS / LIBRARY / "Chart.yaml").read_text())
    assert library["type"] == "library"
    defined = set()
    for template in (CHARTS / LIBRARY / "templates").iterdir():
        defined |= set(re.findall(r'define "([^"]+)"', template.read_text()))
    dependency = {
        "name": LIBRARY,
        "version": library["version"],
        "repository": f"file://../{LIBRARY}",
    }
    for chart in sorted(SETTINGS):
        meta = yaml.safe_load((CHARTS / chart / "Chart.yaml").read_text())
        lock = yaml.safe_load((CHARTS / chart / "Chart.lock").read_text())
        assert meta["dependencies"] == [dependency], chart
        assert lock["dependencies"] == [dependency], chart
        used = set()
        for template in (CHARTS / chart / "templates").rglob("*"):
            if template.is_file():
                text = template.read_text()
                # No copy of the helpers, nor a template of its own in their place.
                assert not re.search(r"{{-?\s*define", text), template
                used |= set(re.findall(r'(?:include|template) "([^"]+)"', text))
        assert used, chart
        assert used <= defined, (chart, used - defined)


def test_the_charts_render_the_library_chart_of_their_tree(tmp_path: Path) -> None:
    # A clean clone: no charts/ built yet. The render packages the library, and renders an
    # edit of it made afterwards (a stale package in charts/ would hide it).
    tree = tmp_path / "helm"
    shutil.copytree(CHARTS, tree, ignore=shutil.ignore_patterns("charts", "tmpcharts-*"))
    chart = "identity-fanout"
    before = render(chart, "default", charts=tree)
    assert before == render(chart, "default")
    helpers = tree / LIBRARY / "templates" / "_helpers.tpl"
    edited = helpers.read_text().replace("part-of: pin\n", "part-of: pin-edited\n")
    assert edited != helpers.read_text()
    helpers.write_text(edited)
    after = render(chart, "default", charts=tree)
    assert {doc["metadata"]["labels"]["app.kubernetes.io/part-of"] for doc in after} == {
        "pin-edited"
    }


@pytest.mark.parametrize("values", VALUES)
@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_configmap_and_secret_refs_cover_every_setting(chart: str, values: str) -> None:
    settings, prefix = SETTINGS[chart]
    docs = render(chart, values)
    expected = {prefix + field.name.upper() for field in msgspec.structs.fields(settings)}
    in_configmap = set(configmap(docs, chart)["data"])
    assert in_configmap == expected - {prefix + name for name in SECRET_SETTINGS | FILE_SETTINGS}
    for name, container in containers(docs):
        if container.get("args") == ["migrate"] or container["name"] == LAG_WATCHER:
            continue
        refs = secret_refs(container)
        assert prefix + "DATABASE_DSN" in refs, name
        if values == "production":  # SASL configured: both credentials from the Secret
            assert {prefix + "KAFKA_SASL_USERNAME", prefix + "KAFKA_SASL_PASSWORD"} <= set(refs)
        plain = {env["name"] for env in container.get("env", []) if "value" in env}
        assert not plain & {prefix + name for name in SECRET_SETTINGS}, name


@pytest.mark.parametrize("values", VALUES)
@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_rendered_configuration_is_accepted_by_the_service(chart: str, values: str) -> None:
    settings, prefix = SETTINGS[chart]
    environ = {**configmap(render(chart, values), chart)["data"]}
    environ[prefix + "DATABASE_DSN"] = "postgresql://u:p@db/x"
    if values == "production":  # SASL: the credentials come from the Secret
        environ |= {prefix + "KAFKA_SASL_USERNAME": "u", prefix + "KAFKA_SASL_PASSWORD": "p"}
    loaded = load_settings(settings, prefix, environ)
    assert loaded.metrics_host == "0.0.0.0"  # type: ignore[attr-defined]  # noqa: S104


@pytest.mark.parametrize("values", VALUES)
@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_pods_are_hardened_and_probed(chart: str, values: str) -> None:
    docs = render(chart, values)
    data = configmap(docs, chart)["data"]
    port = int(next(v for k, v in data.items() if k.endswith("METRICS_PORT")))
    for deployment in of_kind(docs, "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["terminationGracePeriodSeconds"] >= 60  # longer than one batch
        container, *sidecars = pod["containers"]
        assert {c["name"] for c in sidecars} == (SIDECARS if values == "production" else set())
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]  # noqa: S108
        assert container["resources"]["requests"]
        assert container["resources"]["limits"]
        if container["name"] == "ops":  # idle, for `kubectl exec`: serves nothing
            assert "ports" not in container
            assert "livenessProbe" not in container
            continue
        assert container["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}


@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_migration_job_is_a_pre_install_and_pre_upgrade_hook(chart: str) -> None:
    (job,) = of_kind(render(chart), "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["migrate"]


@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_monitoring_objects(chart: str) -> None:
    docs = render(chart, "production")
    metrics = service(docs, chart)
    (monitor,) = of_kind(docs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == metrics["spec"]["ports"][0]["name"]
    # The monitor selects the metrics Service and not `helm test`'s, which lists the same
    # pods: each pod is scraped once.
    selected = monitor["spec"]["selector"]["matchLabels"].items()
    assert [
        s["metadata"]["name"]
        for s in of_kind(docs, "Service")
        if selected <= s["metadata"]["labels"].items()
    ] == [f"{chart}-metrics"]
    (rule,) = of_kind(docs, "PrometheusRule")
    source = yaml.safe_load((ROOT / "infra/monitoring/rules" / f"{chart}.rules.yml").read_text())
    rendered = rule["spec"]["groups"]
    assert [r["alert"] for g in rendered for r in g["rules"]] == [
        r["alert"] for g in source["groups"] for r in g["rules"]
    ]
    for group in rendered:
        for r in group["rules"]:
            assert r["annotations"]["runbook_url"].startswith("https://")
            assert r["annotations"]["runbook_url"].endswith(f"/docs/runbooks/{r['alert']}.md")
    assert of_kind(docs, "PodDisruptionBudget")
    off = ("serviceMonitor.enabled=false", "prometheusRule.enabled=false")
    disabled = render(chart, "default", *off)
    assert not of_kind(disabled, "ServiceMonitor")
    assert not of_kind(disabled, "PrometheusRule")


def test_relay_runs_as_its_own_deployment_unless_told_otherwise() -> None:
    apart = render("identity-fanout")
    args = sorted(c.get("args", []) for _, c in containers(of_kind(apart, "Deployment")))
    assert args == [[], ["lag-watch"], ["relay"], ["worker", "--no-relay"]]  # [] the ops pod
    assert len(of_kind(apart, "PodDisruptionBudget")) == 2
    together = of_kind(
        render("identity-fanout", "default", "relay.separateDeployment=false"), "Deployment"
    )
    assert [
        c.get("args") for d in together for c in d["spec"]["template"]["spec"]["containers"]
    ] == [["lag-watch"], None, ["worker"]]


@pytest.mark.parametrize(
    ("chart", "setting"),
    [
        ("identity-fanout", "config.batchSize=0"),
        ("identity-fanout", "config.pollingInterval=soon"),
        ("identity-fanout", "image.tag=latest"),
        ("identity-fanout", "kafka.sasl.mechanism=PLAIN"),
        ("identity-fanout", "securityContext.readOnlyRootFilesystem=false"),
        ("rewards-membership", "replicaCount=4"),
        ("rewards-membership", "config.logLevel=LOUD"),
        ("rewards-membership", "database.existingSecret="),
        ("rewards-membership", "database.consumer.existingSecret="),
        ("identity-fanout", "database.relay.existingSecret="),
        ("identity-fanout", "database.migration=null"),
        ("identity-fanout", "config.dbRolePrefix=Prod-"),
    ],
)
def test_bad_values_are_rejected(chart: str, setting: str) -> None:
    with pytest.raises(subprocess.CalledProcessError) as failure:
        render(chart, "default", setting)
    assert "Error" in failure.value.stderr


DATABASE_LOGINS = {
    # chart -> the database login (values `database.<kind>`) of each container
    "identity-fanout": {
        "migrate": "migration",
        "worker": "worker",
        "relay": "relay",
        "ops": "operator",
    },
    "rewards-membership": {"migrate": "migration", "consumer": "consumer", "ops": "operator"},
}


def _dsn_secret(container: dict[str, Any], prefix: str) -> dict[str, str]:
    (ref,) = [
        env["valueFrom"]["secretKeyRef"]
        for env in container["env"]
        if env["name"] == prefix + "DATABASE_DSN"
    ]
    return dict(ref)


@pytest.mark.parametrize("values", VALUES)
@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_the_migration_job_and_each_pod_kind_log_in_with_their_own_secret(
    chart: str, values: str
) -> None:
    _, prefix = SETTINGS[chart]
    docs = render(chart, values)
    chosen = yaml.safe_load((CHARTS / chart / "values.yaml").read_text())["database"]
    if values == "production":
        production = CHARTS / chart / "ci" / "production-values.yaml"
        chosen = yaml.safe_load(production.read_text())["database"]
    seen = {}
    for _, container in containers(docs):
        if container["name"] == LAG_WATCHER:  # Kafka only: no database login at all
            assert all(e["name"] != prefix + "DATABASE_DSN" for e in container.get("env", []))
            continue
        kind = DATABASE_LOGINS[chart][container["name"]]
        seen[container["name"]] = _dsn_secret(container, prefix)
        assert seen[container["name"]] == {
            "name": chosen[kind]["existingSecret"],
            "key": chosen[kind]["dsnKey"],
        }
    assert set(seen) == set(DATABASE_LOGINS[chart])
    # The owner's Secret is the Job's alone: no long-running pod can change the schema.
    owner = seen.pop("migrate")
    assert owner not in seen.values()
    assert len({ref["name"] for ref in seen.values()}) == len(seen)
    (job,) = of_kind(docs, "Job")
    (migrate,) = job["spec"]["template"]["spec"]["containers"]
    plain = {env["name"]: env["value"] for env in migrate["env"] if "value" in env}
    expected_prefix = "prod_" if values == "production" else ""
    assert plain[prefix + "DB_ROLE_PREFIX"] == expected_prefix


def test_the_ops_pod_waits_for_kubectl_exec_as_the_operator() -> None:
    docs = render("rewards-membership", "default")
    (ops,) = [c for _, c in containers(docs) if c["name"] == "ops"]
    assert ops["command"][0] == "python"
    assert "signal.pause()" in ops["command"][-1]
    assert _dsn_secret(ops, REWARDS_PREFIX)["name"] == "rewards-membership-database-operator"
    assert ops["envFrom"] == [{"configMapRef": {"name": "rewards-membership"}}]
    without = render("rewards-membership", "default", "ops.enabled=false")
    assert [c["name"] for _, c in containers(without)] == [LAG_WATCHER, "consumer", "migrate"]


def test_workers_running_the_relay_keep_the_worker_login() -> None:
    docs = render("identity-fanout", "default", "relay.separateDeployment=false")
    assert sorted(c["name"] for _, c in containers(docs)) == [
        LAG_WATCHER,
        "migrate",
        "ops",
        "worker",
    ]
    (worker,) = [c for _, c in containers(docs) if c["name"] == "worker"]
    assert worker["args"] == ["worker"]
    assert _dsn_secret(worker, IDENTITY_PREFIX)["name"] == "identity-fanout-database-worker"


def _tcp(*ports: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": port} for port in ports]


@pytest.mark.parametrize("values", VALUES)
@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_network_policy_allows_only_the_dependencies_and_the_scrapers(
    chart: str, values: str
) -> None:
    docs = render(chart, values)
    (policy,) = of_kind(docs, "NetworkPolicy")
    data = configmap(docs, chart)["data"]
    metrics_port = int(next(v for k, v in data.items() if k.endswith("METRICS_PORT")))
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    # It selects every pod of the release: workers, relay and the migration Job.
    selector = spec["podSelector"]["matchLabels"]
    for doc in docs:
        if doc["kind"] in {"Deployment", "Job"}:
            labels = doc["spec"]["template"]["metadata"]["labels"]
            assert selector.items() <= labels.items(), doc["metadata"]["name"]
    # Ingress: the metrics port only, from the monitoring namespace only, and from the
    # release's own `helm test` pod.
    ingress, tester = spec["ingress"]
    assert tester == {
        "from": [
            {
                "podSelector": {
                    "matchLabels": {
                        "app.kubernetes.io/instance": chart,
                        "app.kubernetes.io/component": "helm-test",
                    }
                }
            }
        ],
        "ports": _tcp(metrics_port),
    }
    assert ingress["ports"] == _tcp(metrics_port)
    (source,) = ingress["from"]
    assert source["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}
    }
    # Egress: PostgreSQL, Kafka, the OTLP collector (only where there is one), DNS; every rule
    # names its ports (none allows all).
    if values == "production":
        postgres, kafka, otlp, dns = spec["egress"]
    else:  # no otel.endpoint: nothing to reach
        postgres, kafka, dns = spec["egress"]
    assert all(rule["ports"] for rule in spec["egress"])
    assert dns["ports"] == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    assert dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    if values == "production":  # peers named: nothing else is reachable even on those ports
        assert postgres == {"ports": _tcp(5432), "to": [{"ipBlock": {"cidr": "10.20.0.0/24"}}]}
        assert kafka["ports"] == _tcp(9093)
        assert kafka["to"][0]["namespaceSelector"]["matchLabels"] == {
            "kubernetes.io/metadata.name": "kafka"
        }
        assert otlp["ports"] == _tcp(4318)
        assert source["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}
    else:
        assert postgres == {"ports": _tcp(5432)}
        assert kafka == {"ports": _tcp(9092, 9093)}
        assert "podSelector" not in source


@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_network_policy_follows_its_values_and_can_be_disabled(chart: str) -> None:
    assert not of_kind(render(chart, "default", "networkPolicy.enabled=false"), "NetworkPolicy")
    (policy,) = of_kind(
        render(
            chart,
            "default",
            "networkPolicy.egress.postgres.ports={6432}",
            "networkPolicy.egress.postgres.to[0].ipBlock.cidr=192.0.2.0/24",
            "networkPolicy.ingress.metrics.namespaceSelector.matchLabels.team=observability",
        ),
        "NetworkPolicy",
    )
    assert policy["spec"]["egress"][0] == {
        "ports": _tcp(6432),
        "to": [{"ipBlock": {"cidr": "192.0.2.0/24"}}],
    }
    assert policy["spec"]["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring",
        "team": "observability",
    }


@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_client_certificate_is_mounted_and_its_key_password_referenced(chart: str) -> None:
    settings, prefix = SETTINGS[chart]
    docs = render(
        chart,
        "default",
        "kafka.securityProtocol=SSL",
        "kafka.tls.caSecret=kafka-ca",
        "kafka.tls.clientSecret=kafka-client",
        "kafka.tls.keyPasswordSecret=kafka-client-key",
    )
    data = configmap(docs, chart)["data"]
    assert data[prefix + "KAFKA_SSL_CERTIFICATE_LOCATION"] == "/etc/pin/kafka-client/tls.crt"
    assert data[prefix + "KAFKA_SSL_KEY_LOCATION"] == "/etc/pin/kafka-client/tls.key"
    assert data[prefix + "KAFKA_ALLOW_PLAINTEXT_SASL_PLAIN"] == "false"
    loaded = load_settings(
        settings,
        prefix,
        {
            **data,
            prefix + "DATABASE_DSN": "postgresql://u:p@db/x",
            prefix + "KAFKA_SSL_KEY_PASSWORD": "k",
        },
    )
    assert loaded.kafka_security()["ssl.key.location"] == "/etc/pin/kafka-client/tls.key"  # type: ignore[attr-defined]
    for name, container in containers(docs):
        if container.get("args") == ["migrate"]:
            continue
        refs = {e["name"]: e["valueFrom"] for e in container["env"] if "valueFrom" in e}
        assert refs[prefix + "KAFKA_SSL_KEY_PASSWORD"]["secretKeyRef"] == {
            "name": "kafka-client-key",
            "key": "password",
        }, name
        assert {
            "name": "kafka-client",
            "mountPath": "/etc/pin/kafka-client",
            "readOnly": True,
        } in container["volumeMounts"]


PASSWORD_FILES = ("kafka.sasl.passwordFile=true", "kafka.sasl.mechanism=SCRAM-SHA-512")


@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_password_files_are_mounted_whole_and_named_by_their_variables(chart: str) -> None:
    settings, prefix = SETTINGS[chart]
    kinds = {kind for kind in DATABASE_LOGINS[chart].values() if kind != "migration"}
    docs = render(
        chart,
        "default",
        "kafka.securityProtocol=SASL_SSL",
        "kafka.sasl.existingSecret=kafka-user",
        *PASSWORD_FILES,
        *(f"database.{kind}.passwordKey=password" for kind in kinds),
    )
    values = yaml.safe_load((CHARTS / chart / "values.yaml").read_text())["database"]
    seen = set()
    for doc in docs:
        if doc["kind"] not in {"Deployment", "Job"}:
            continue
        pod = doc["spec"]["template"]["spec"]
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        for container in pod["containers"]:
            if container["name"] in SIDECARS:
                continue
            env = {e["name"]: e for e in container.get("env", [])}
            mounts = {m["name"]: m for m in container.get("volumeMounts", [])}
            seen.add(container["name"])
            # Kafka: the file, never the variable (the service refuses both).
            assert prefix + "KAFKA_SASL_PASSWORD" not in env, container["name"]
            if container.get("args") == ["migrate"]:
                assert prefix + "DATABASE_PASSWORD_FILE" not in env
                continue
            assert env[prefix + "KAFKA_SASL_PASSWORD_FILE"]["value"] == (
                "/etc/pin/kafka-sasl/password"
            )
            assert volumes["kafka-sasl"]["secret"]["secretName"] == "kafka-user"
            assert volumes["kafka-sasl"]["secret"]["items"] == [
                {"key": "password", "path": "password"}
            ]
            # Mounted whole: a subPath mount is never updated when the Secret changes.
            assert mounts["kafka-sasl"] == {
                "name": "kafka-sasl",
                "mountPath": "/etc/pin/kafka-sasl",
                "readOnly": True,
            }
            if container["name"] == LAG_WATCHER:  # no database login at all
                assert "database-password" not in volumes
                continue
            kind = DATABASE_LOGINS[chart][container["name"]]
            assert env[prefix + "DATABASE_PASSWORD_FILE"]["value"] == ("/etc/pin/database/password")
            assert volumes["database-password"]["secret"] == {
                "secretName": values[kind]["existingSecret"],
                "defaultMode": 0o440,
                "items": [{"key": "password", "path": "password"}],
            }
            assert mounts["database-password"] == {
                "name": "database-password",
                "mountPath": "/etc/pin/database",
                "readOnly": True,
            }
            assert "subPath" not in mounts["database-password"]
    assert seen >= set(DATABASE_LOGINS[chart]) | {LAG_WATCHER}
    # What the pods get is what the service takes: a DSN without a password and both files.
    data = configmap(docs, chart)["data"]
    loaded = load_settings(
        settings,
        prefix,
        {
            **data,
            prefix + "DATABASE_DSN": "postgresql://u@db/x",
            prefix + "DATABASE_PASSWORD_FILE": "/etc/pin/database/password",
            prefix + "KAFKA_SASL_USERNAME": "u",
            prefix + "KAFKA_SASL_PASSWORD_FILE": "/etc/pin/kafka-sasl/password",
        },
    )
    assert loaded.kafka_sasl_password_file == "/etc/pin/kafka-sasl/password"  # type: ignore[attr-defined]


@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_without_password_files_nothing_more_is_mounted(chart: str) -> None:
    for values in VALUES:
        for doc in render(chart, values):
            if doc["kind"] in {"Deployment", "Job"}:
                names = {v["name"] for v in doc["spec"]["template"]["spec"]["volumes"]}
                assert not names & {"kafka-sasl", "database-password"}


@pytest.mark.parametrize(
    "setting",
    [
        "extraVolumes[0].name=kafka-sasl",
        "extraVolumes[0].name=database-password",
        "extraVolumeMounts[0].name=x,extraVolumeMounts[0].mountPath=/etc/pin/database",
        "kafka.sasl.passwordFile=yes",
    ],
)
@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_bad_password_file_values_are_rejected(chart: str, setting: str) -> None:
    kind = "relay" if chart == "identity-fanout" else "consumer"
    for bad in (setting, f"database.{kind}.passwordKey=a key"):
        with pytest.raises(subprocess.CalledProcessError) as failure:
            render(chart, "default", bad)
        assert "Error" in failure.value.stderr


@pytest.mark.parametrize(
    "setting",
    [
        "networkPolicy.enabled=maybe",
        "networkPolicy.egress.postgres.ports={0}",
        "networkPolicy.egress.kafka.ports=null",
        "networkPolicy.egress.otlp.to[0].ipBlock.cidr=everything",
        "networkPolicy.egress.smtp.ports={25}",
        "networkPolicy.ingress.metrics.namespaceSelector.matchNames[0]=monitoring",
        "kafka.tls.clientSecret=kafka-client",  # a client certificate without TLS
        "kafka.tls.keyPasswordSecret=kafka-client-key",  # a key password without a certificate
    ],
)
@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_bad_network_and_tls_values_are_rejected(chart: str, setting: str) -> None:
    with pytest.raises(subprocess.CalledProcessError) as failure:
        render(chart, "default", setting)
    assert "Error" in failure.value.stderr


@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_sasl_plain_in_clear_text_needs_the_explicit_value(chart: str) -> None:
    plain = (
        "kafka.securityProtocol=SASL_PLAINTEXT",
        "kafka.sasl.mechanism=PLAIN",
        "kafka.sasl.existingSecret=kafka-user",
    )
    with pytest.raises(subprocess.CalledProcessError):
        render(chart, "default", *plain)
    docs = render(chart, "default", *plain, "kafka.sasl.allowPlaintextPlain=true")
    _, prefix = SETTINGS[chart]
    for suffix in ("", "-lag-watcher"):
        data = configmap(docs, chart, suffix)["data"]
        assert data[prefix + "KAFKA_ALLOW_PLAINTEXT_SASL_PLAIN"] == "true"


@pytest.mark.parametrize("values", VALUES)
@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_the_lag_watcher_gets_exactly_its_settings_and_the_kafka_credentials(
    chart: str, values: str
) -> None:
    _, prefix = SETTINGS[chart]
    settings = LAG_WATCH_SETTINGS[chart]
    docs = render(chart, values)
    data = configmap(docs, chart, "-lag-watcher")["data"]
    expected = {prefix + field.name.upper() for field in msgspec.structs.fields(settings)}
    assert set(data) == expected - {prefix + name for name in SECRET_SETTINGS | FILE_SETTINGS}
    environ = dict(data)
    if values == "production":  # SASL: the credentials come from the Secret
        environ |= {prefix + "KAFKA_SASL_USERNAME": "u", prefix + "KAFKA_SASL_PASSWORD": "p"}
    loaded = load_settings(settings, prefix, environ)
    defaults = settings()
    assert loaded.lag_watch_topics == defaults.lag_watch_topics  # type: ignore[attr-defined]
    assert loaded.lag_watch_groups == defaults.lag_watch_groups  # type: ignore[attr-defined]
    assert loaded.lag_watch_discover == defaults.lag_watch_discover  # type: ignore[attr-defined]
    (deployment,) = [
        d for d in of_kind(docs, "Deployment") if d["metadata"]["name"] == f"{chart}-lag-watcher"
    ]
    assert deployment["spec"]["replicas"] == 1
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["lag-watch"]
    assert container["envFrom"] == [{"configMapRef": {"name": f"{chart}-lag-watcher"}}]
    refs = set(secret_refs(container))
    if values == "production":
        assert refs == {prefix + "KAFKA_SASL_USERNAME", prefix + "KAFKA_SASL_PASSWORD"}
    else:
        assert refs == set()
    # Scraped like every pod of the release: the metrics Service selects it.
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service(docs, chart)["spec"]["selector"].items() <= labels.items()


@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_the_lag_watcher_can_be_switched_off_for_an_existing_exporter(chart: str) -> None:
    docs = render(chart, "default", "lagWatcher.enabled=false")
    assert all(c["name"] != LAG_WATCHER for _, c in containers(docs))
    assert [d["metadata"]["name"] for d in of_kind(docs, "ConfigMap")] == [chart]


@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_extra_volumes_init_containers_sidecars_and_opentelemetry_reach_every_pod(
    chart: str,
) -> None:
    docs = render(chart, "production")
    for deployment in of_kind(docs, "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        name = deployment["metadata"]["name"]
        assert {"name": "trust", "emptyDir": {}} in pod["volumes"], name
        assert [c["name"] for c in pod["initContainers"]] == ["trust-bundle"], name
        own, sidecar = pod["containers"]
        assert sidecar["name"] == "log-shipper"
        mount = {"name": "trust", "mountPath": "/etc/pin/trust", "readOnly": True}
        assert mount in own["volumeMounts"], name
        env = {e["name"]: e.get("value") for e in own["env"]}
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability.svc:4318"
        assert env["OTEL_TRACES_EXPORTER"] == "otlp"
        assert (env["OTEL_TRACES_SAMPLER"], env["OTEL_TRACES_SAMPLER_ARG"]) == (
            "parentbased_traceidratio",
            "0.25",
        )
        assert env["OTEL_RESOURCE_ATTRIBUTES"] == (
            "k8s.namespace.name=pin,k8s.pod.name=$(K8S_POD_NAME),"
            "deployment.environment.name=production,team=platform"
        )
        # The pod's name is defined before the variable that refers to it.
        order = [e["name"] for e in own["env"]]
        assert order.index("K8S_POD_NAME") < order.index("OTEL_RESOURCE_ATTRIBUTES")
    # Without an endpoint no exporter is configured; the resource attributes still are.
    default = render(chart, "default")
    for _, container in containers(default):
        names = {e["name"] for e in container.get("env", [])}
        assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in names
        if container["name"] != "migrate":
            assert "OTEL_RESOURCE_ATTRIBUTES" in names


def readyz_test(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], str]:
    """`helm test`'s pod and the Python program its container runs."""
    (pod,) = of_kind(docs, "Pod")
    (container,) = pod["spec"]["containers"]
    assert container["command"][:2] == ["python", "-c"]
    return pod, container["command"][-1]


def serving_pods(docs: list[dict[str, Any]]) -> int:
    """The replicas of the release's Deployments that serve /readyz (a metrics port)."""
    return sum(
        deployment["spec"]["replicas"]
        for deployment in of_kind(docs, "Deployment")
        if "ports" in deployment["spec"]["template"]["spec"]["containers"][0]
    )


class FakeCluster:
    """What the `helm test` program sees when it runs: the DNS answer for the `-pods` Service,
    the /readyz answer of each address, and a clock that `time.sleep` moves on."""

    def __init__(self, addresses: list[str], unready: set[str]) -> None:
        self.addresses, self.unready = addresses, unready
        self.resolved: list[str] = []
        self.asked: list[str] = []
        self.now = 0.0

    def getaddrinfo(self, host: str, port: int, type: int = 0) -> list[tuple[Any, ...]]:
        self.resolved.append(host)
        if not self.addresses:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, type, 6, "", (address, port)) for address in self.addresses]

    def urlopen(self, url: str, timeout: float) -> io.BytesIO:
        self.asked.append(url)
        if any(f"//{address}:" in url for address in self.unready):
            raise urllib.error.HTTPError(url, 503, "Service Unavailable", None, None)  # type: ignore[arg-type]
        return io.BytesIO(b"{}")

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def run(self, program: str) -> None:
        """Run the program with this cluster in place of the network and the clock."""
        fakes = {
            "socket": SimpleNamespace(
                getaddrinfo=self.getaddrinfo,
                SOCK_STREAM=socket.SOCK_STREAM,
                gaierror=socket.gaierror,
            ),
            "time": SimpleNamespace(monotonic=lambda: self.now, sleep=self.sleep),
            "urllib.request": SimpleNamespace(request=SimpleNamespace(urlopen=self.urlopen)),
        }

        def fake_import(name: str, *args: Any, **kwargs: Any) -> Any:
            return fakes[name] if name in fakes else builtins.__import__(name, *args, **kwargs)

        environment = {"__builtins__": {**vars(builtins), "__import__": fake_import}}
        exec(program, environment)  # noqa: S102  # the chart's own rendered test program


@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_helm_test_pod_is_the_release_s_own_and_hardened(chart: str) -> None:
    pod, _ = readyz_test(render(chart, "default"))
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "helm-test"
    assert "app.kubernetes.io/name" not in pod["metadata"]["labels"]  # not the policy's pods
    (container,) = pod["spec"]["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["restartPolicy"] == "Never"


@pytest.mark.parametrize(
    ("chart", "sets"),
    [
        ("identity-fanout", ()),
        ("identity-fanout", ("relay.separateDeployment=false",)),
        ("identity-fanout", ("replicaCount=1", "relay.replicaCount=3")),
        ("identity-fanout", ("lagWatcher.enabled=false",)),
        ("rewards-membership", ()),
        ("rewards-membership", ("replicaCount=1", "lagWatcher.enabled=false")),
    ],
)
def test_helm_test_asks_every_pod_for_readyz_ready_or_not(
    chart: str, sets: tuple[str, ...]
) -> None:
    docs = render(chart, "default", *sets)
    # A headless Service that lists the pods that are not ready too: DNS answers with every
    # pod's address, where the metrics Service would answer with one virtual IP.
    pods_service, metrics = service(docs, chart, "-pods"), service(docs, chart)
    assert pods_service["spec"]["clusterIP"] == "None"
    assert pods_service["spec"]["publishNotReadyAddresses"] is True
    # It selects exactly the pods with a metrics port: by the release's labels alone the ops
    # pod is listed too (an EndpointSlice without ports, whose address DNS still answers
    # with: found on a real cluster).
    selector = pods_service["spec"]["selector"]
    assert metrics["spec"]["selector"].items() <= selector.items()
    for deployment in of_kind(docs, "Deployment"):
        template = deployment["spec"]["template"]
        labels = template["metadata"]["labels"]
        selected = all(labels.get(k) == v for k, v in selector.items())
        ports = [p for c in template["spec"]["containers"] for p in c.get("ports", [])]
        serves = any(p["name"] == "metrics" for p in ports)
        assert selected == serves, deployment["metadata"]["name"]
    assert pods_service["spec"]["ports"][0]["targetPort"] == "metrics"
    port = int(
        next(v for k, v in configmap(docs, chart)["data"].items() if k.endswith("METRICS_PORT"))
    )
    _, program = readyz_test(docs)
    expected = serving_pods(docs)
    addresses = [f"10.0.0.{n}" for n in range(1, expected + 1)]

    # Every pod ready: each one asked on its metrics port.
    cluster = FakeCluster(addresses, unready=set())
    cluster.run(program)
    assert set(cluster.resolved) == {f"{chart}-pods"}
    assert sorted(cluster.asked) == sorted(f"http://{a}:{port}/readyz" for a in addresses)

    # One pod not ready among ready ones: the test fails, naming it, after its two minutes.
    cluster = FakeCluster(addresses, unready={addresses[-1]})
    with pytest.raises(SystemExit) as failure:
        cluster.run(program)
    assert f"{addresses[-1]}: HTTP Error 503" in str(failure.value.code)
    assert 120 <= cluster.now <= 125
    assert cluster.asked.count(f"http://{addresses[-1]}:{port}/readyz") > 1  # it retried

    # A pod missing (not scheduled yet: no address) fails it too, however ready the others.
    cluster = FakeCluster(addresses[:-1], unready=set())
    with pytest.raises(SystemExit) as failure:
        cluster.run(program)
    assert f"{expected - 1} of {expected} pods listed" in str(failure.value.code)


# --- What a platform team's overlay sets (ci/overlay-values.yaml): each key's effect ---

OVERLAY = "overlay"
# The component whose own keys the overlay sets (in place of the top-level ones), and one
# that takes the top-level ones.
OWN_COMPONENT = {"identity-fanout": "relay", "rewards-membership": "lag-watcher"}
TOP_LEVEL_COMPONENT = {"identity-fanout": "worker", "rewards-membership": "consumer"}


def overlay(chart: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(
        (CHARTS / chart / "ci" / "overlay-values.yaml").read_text()
    )
    return loaded


def pods(docs: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(object, pod template) of every Deployment and Job."""
    for doc in docs:
        if doc["kind"] in {"Deployment", "Job"}:
            yield doc, doc["spec"]["template"]


def component(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = [
        doc
        for doc in docs
        if doc["kind"] in {"Deployment", "Job"}
        and doc["metadata"]["labels"].get("app.kubernetes.io/component") == name
    ]
    return found


def values_file(tmp_path: Path, values: dict[str, Any]) -> Path:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def refused(chart: str, *sets: str, files: tuple[Path, ...] = ()) -> str:
    """The error of a render that must fail."""
    with pytest.raises(subprocess.CalledProcessError) as failure:
        render(chart, "default", *sets, files=files)
    stderr: str = failure.value.stderr
    assert "Error" in stderr
    return stderr


@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_name_overrides_rename_every_object_and_keep_references_whole(chart: str) -> None:
    _, prefix = SETTINGS[chart]
    for sets, fullname, name in [
        (("nameOverride=fanout",), "pin-fanout", "fanout"),
        (("fullnameOverride=pin-x",), "pin-x", chart),
        (("nameOverride=fanout", "fullnameOverride=pin-x"), "pin-x", "fanout"),
    ]:
        docs = render(chart, "default", *sets, release="pin")
        for doc in docs:
            assert doc["metadata"]["name"].startswith(fullname), doc["metadata"]["name"]
            if doc["kind"] != "Pod" and doc["metadata"]["labels"].get(
                "app.kubernetes.io/component"
            ) not in {"helm-test"}:
                assert doc["metadata"]["labels"]["app.kubernetes.io/name"] == name
        # The pods are still selected, read the renamed ConfigMap and keep the service's prefix.
        assert configmap(docs, fullname)["data"][prefix + "METRICS_PORT"]
        for doc, template in pods(docs):
            if doc["kind"] == "Deployment":
                selector = doc["spec"]["selector"]["matchLabels"]
                assert selector.items() <= template["metadata"]["labels"].items()
                assert template["spec"]["serviceAccountName"] == fullname
        metrics = service(docs, fullname)
        assert metrics["spec"]["selector"]["app.kubernetes.io/name"] == name
    assert "nameOverride" in refused(chart, "nameOverride=Not_A_Name")


@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_common_labels_are_on_every_object_and_pod_but_not_in_selectors(chart: str) -> None:
    docs = render(chart, OVERLAY)
    common = overlay(chart)["commonLabels"]
    assert common
    for doc in docs:
        assert common.items() <= doc["metadata"]["labels"].items(), doc["metadata"]["name"]
    for doc, template in pods(docs):
        labels = template["metadata"]["labels"]
        assert common.items() <= labels.items(), doc["metadata"]["name"]
        assert labels["tier"] == "backend"  # podLabels, the migration Job's too
        if doc["kind"] == "Deployment":
            assert not common.keys() & doc["spec"]["selector"]["matchLabels"].keys()
    # The chart's own labels are not for an overlay to change.
    refused(chart, "commonLabels.app\\.kubernetes\\.io/instance=other")


@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_the_image_is_registry_slash_repository(chart: str) -> None:
    mirror = "mirror.example.com:5000/pin-mirror"
    docs = render(chart, OVERLAY)
    image = overlay(chart)["image"]
    tag = ":" + yaml.safe_load((CHARTS / chart / "Chart.yaml").read_text())["appVersion"]
    reference = f"@{image['digest']}" if image.get("digest") else f":{image.get('tag') or tag[1:]}"
    images = {c["image"] for doc in docs if doc["kind"] != "Pod" for _, c in containers([doc])}
    images |= {c["image"] for pod in of_kind(docs, "Pod") for c in pod["spec"]["containers"]}
    assert images == {f"{mirror}/pin/{chart}{reference}"}
    default = {c["image"] for _, c in containers(render(chart))}
    assert default == {f"registry.example.internal/pin/{chart}{tag}"}
    # A values file of chart 0.1.0 names the whole reference in repository: kept as it is.
    old = {c["image"] for _, c in containers(render(chart, "default", f"image.repository={chart}"))}
    assert old == {f"{chart}{tag}"}


@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_extra_env_from_reaches_every_container_after_the_charts_config_map(chart: str) -> None:
    docs = render(chart, OVERLAY)
    extra = overlay(chart)["extraEnvFrom"]
    seen = set()
    for _, container in containers(docs):
        seen.add(container["name"])
        env_from = container["envFrom"]
        assert env_from[-len(extra) :] == extra, container["name"]
        if container["name"] != "migrate":  # the chart's ConfigMap first, so these win
            assert "configMapRef" in env_from[0]
            assert len(env_from) == 1 + len(extra)
    assert "migrate" in seen
    assert LAG_WATCHER in seen


@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_startup_probe_holds_the_other_probes_back_when_enabled(chart: str) -> None:
    for _, container in containers(render(chart)):
        assert "startupProbe" not in container
    probed = 0
    for _, container in containers(render(chart, OVERLAY)):
        if "livenessProbe" not in container:  # the ops pod and the migration Job
            assert "startupProbe" not in container
            continue
        probed += 1
        assert container["startupProbe"] == {
            "httpGet": {"path": "/healthz", "port": "metrics"},
            "periodSeconds": 5,
            "timeoutSeconds": 3,
            "failureThreshold": 60,
        }
    assert probed >= 2
    refused(chart, "startupProbe.successThreshold=2")


@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_service_monitor_takes_relabelings(chart: str) -> None:
    (monitor,) = of_kind(render(chart, OVERLAY), "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["relabelings"] == overlay(chart)["serviceMonitor"]["relabelings"]
    assert endpoint["metricRelabelings"] == overlay(chart)["serviceMonitor"]["metricRelabelings"]
    (default,) = of_kind(render(chart), "ServiceMonitor")
    assert "relabelings" not in default["spec"]["endpoints"][0]
    assert "metricRelabelings" not in default["spec"]["endpoints"][0]
    refused(chart, "serviceMonitor.metricRelabelings[0].action=explode")


@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_pod_disruption_budget_takes_min_available_or_max_unavailable(chart: str) -> None:
    def budgets(*sets: str) -> list[dict[str, Any]]:
        return [
            doc["spec"] for doc in of_kind(render(chart, "default", *sets), "PodDisruptionBudget")
        ]

    assert all(spec["maxUnavailable"] == 1 and "minAvailable" not in spec for spec in budgets())
    assert all(
        spec["maxUnavailable"] == 2 for spec in budgets("podDisruptionBudget.maxUnavailable=2")
    )
    for setting, expected in [("minAvailable=2", 2), ("minAvailable=50%", "50%")]:
        for spec in budgets(f"podDisruptionBudget.{setting}"):
            assert spec["minAvailable"] == expected
            assert "maxUnavailable" not in spec
    refused(chart, "podDisruptionBudget.minAvailable=1", "podDisruptionBudget.maxUnavailable=1")


@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_a_component_takes_its_own_annotations_and_scheduling_else_the_releases(
    chart: str,
) -> None:
    docs = render(chart, OVERLAY)
    values = overlay(chart)
    own_key = "relay" if chart == "identity-fanout" else "lagWatcher"
    own = values[own_key]
    apart = component(docs, OWN_COMPONENT[chart])
    shared = component(docs, TOP_LEVEL_COMPONENT[chart])
    # The release's: annotations, scheduling.
    pod = shared["spec"]["template"]
    assert shared["metadata"]["annotations"] == values["deploymentAnnotations"]
    assert pod["metadata"]["annotations"].items() >= values["podAnnotations"].items()
    assert "checksum/config" in pod["metadata"]["annotations"]
    assert pod["spec"]["nodeSelector"] == values["nodeSelector"]
    assert pod["spec"]["tolerations"] == values["tolerations"]
    assert pod["spec"]["affinity"] == values["affinity"]
    assert pod["spec"]["priorityClassName"] == "pin-workers"
    # The component's own, empty ones included: none of the release's.
    pod = apart["spec"]["template"]
    assert "annotations" not in apart["metadata"]
    assert pod["metadata"]["annotations"].keys() == {"checksum/config", *own["podAnnotations"]}
    assert pod["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
    assert pod["spec"]["nodeSelector"] == own["nodeSelector"]
    assert "tolerations" not in pod["spec"]
    assert "affinity" not in pod["spec"]
    # The ops pod sets nothing of its own: the release's.
    ops = component(docs, "ops")["spec"]["template"]["spec"]
    assert ops["nodeSelector"] == values["nodeSelector"]
    # Without the overlay: none anywhere.
    for doc, template in pods(render(chart)):
        assert "nodeSelector" not in template["spec"], doc["metadata"]["name"]
        if doc["kind"] == "Deployment":
            assert "annotations" not in doc["metadata"]


@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_the_migration_job_gets_the_pods_volumes_env_scheduling_and_annotations(
    chart: str,
) -> None:
    _, prefix = SETTINGS[chart]
    docs = render(chart, OVERLAY)
    values = overlay(chart)
    job = component(docs, "migrate")
    template = job["spec"]["template"]
    spec = template["spec"]
    # A CA for sslmode=verify-full: the Secret's volume, its mount and PGSSLROOTCERT.
    assert values["extraVolumes"][0] in spec["volumes"]
    (container,) = spec["containers"]  # no sidecar: the Job would never complete
    assert values["extraVolumeMounts"][0] in container["volumeMounts"]
    env = {e["name"]: e for e in container["env"]}
    assert env["PGSSLROOTCERT"]["value"] == "/etc/pin/pg-ca/ca.crt"
    assert prefix + "DATABASE_DSN" in env
    assert container["envFrom"] == values["extraEnvFrom"]
    # A sidecar injector's annotation, the pod's labels, scheduling, identity, security.
    assert template["metadata"]["annotations"] == values["podAnnotations"]
    assert template["metadata"]["labels"]["tier"] == "backend"
    assert spec["nodeSelector"] == values["nodeSelector"]
    assert spec["tolerations"] == values["tolerations"]
    assert spec["affinity"] == values["affinity"]
    assert spec["priorityClassName"] == "pin-workers"
    assert spec["imagePullSecrets"] == [{"name": "mirror-pull"}]
    assert spec["serviceAccountName"] == values["serviceAccount"]["name"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert [c["name"] for c in spec["initContainers"]] == ["wait-for-mesh"]
    # The NetworkPolicy still selects it.
    (policy,) = of_kind(docs, "NetworkPolicy")
    assert (
        policy["spec"]["podSelector"]["matchLabels"].items()
        <= template["metadata"]["labels"].items()
    )
    # Without the overlay: its own volume and env only.
    default = component(render(chart), "migrate")["spec"]["template"]
    assert [v["name"] for v in default["spec"]["volumes"]] == ["tmp"]
    assert "annotations" not in default["metadata"]
    assert "envFrom" not in default["spec"]["containers"][0]


@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_large_integers_render_as_integers(chart: str, tmp_path: Path) -> None:
    settings, prefix = SETTINGS[chart]
    big = {"migrations": {"activeDeadlineSeconds": 1_000_000, "ttlSecondsAfterFinished": 2_592_000}}
    if chart == "identity-fanout":
        big["config"] = {
            "relayWindowBytes": 4_000_000_000,
            "maxOutboxBacklog": 10_000_000,
            "relayMessageMaxBytes": 16_777_216,
        }
    docs = render(chart, "default", files=(values_file(tmp_path, big),))
    data = configmap(docs, chart)["data"]
    for key, value in big.get("config", {}).items():
        name = prefix + re.sub(r"(?<!^)(?=[A-Z])", "_", key).upper()
        assert data[name] == str(value), name
    job = component(docs, "migrate")["spec"]
    assert job["activeDeadlineSeconds"] == 1_000_000
    assert job["ttlSecondsAfterFinished"] == 2_592_000
    # No number anywhere in the ConfigMaps in exponent form, and the service reads them.
    for doc in of_kind(docs, "ConfigMap"):
        for name, value in doc["data"].items():
            assert not re.fullmatch(r"[0-9.]+e[+-][0-9]+", value), (name, value)
    environ = {**data, prefix + "DATABASE_DSN": "postgresql://u:p@db/x"}
    loaded = load_settings(settings, prefix, environ)
    if chart == "identity-fanout":
        assert loaded.relay_window_bytes == 4_000_000_000  # type: ignore[attr-defined]


@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_alert_rules_need_an_absolute_runbook_url(chart: str) -> None:
    # Off by default, so the defaults render and lint.
    assert not of_kind(render(chart), "PrometheusRule")
    # On without a base URL, or with a relative one: the render fails, saying why.
    stderr = refused(chart, "prometheusRule.enabled=true")
    assert "prometheusRule.runbookBaseUrl must be an absolute http(s) URL" in stderr
    refused(chart, "prometheusRule.enabled=true", "prometheusRule.runbookBaseUrl=docs/runbooks")
    # On with one: every alert links to its page under it.
    base = "https://git.example.com/pin/pin-workers/-/blob/main/"
    docs = render(
        chart, "default", "prometheusRule.enabled=true", f"prometheusRule.runbookBaseUrl={base}"
    )
    (rule,) = of_kind(docs, "PrometheusRule")
    urls = [r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert urls
    assert all(url.startswith(base + "docs/runbooks/") for url in urls)


@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_helm_lint_strict_passes_with_the_default_values(chart: str) -> None:
    build_dependencies(CHARTS / chart)
    done = subprocess.run(
        [helm(), "lint", "--strict", str(CHARTS / chart)],
        check=False,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def otel_environment(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"] if e["name"].startswith("OTEL_")}


def otlp_ports(docs: list[dict[str, Any]]) -> list[int] | None:
    """The ports the NetworkPolicy opens to the collector; None: no rule for it."""
    (policy,) = of_kind(docs, "NetworkPolicy")
    rules = policy["spec"]["egress"]
    # postgres, kafka, [otlp], dns: the rule between Kafka's and DNS's
    if len(rules) == 3:
        return None
    return [port["port"] for port in rules[2]["ports"]]


@pytest.mark.parametrize(
    ("protocol", "endpoint", "port", "exporter"),
    [
        ("grpc", "http://otel-collector.observability:4317", 4317, GrpcSpanExporter),
        ("http/protobuf", "http://otel-collector.observability:4318", 4318, HttpSpanExporter),
        ("grpc", "https://collector.example.com:443", 443, GrpcSpanExporter),
    ],
)
@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_otlp_protocol_env_and_network_policy_port_agree(
    chart: str, protocol: str, endpoint: str, port: int, exporter: type[SpanExporter]
) -> None:
    docs = render(chart, "default", f"otel.endpoint={endpoint}", f"otel.protocol={protocol}")
    assert otlp_ports(docs) == [port]
    for name, container in containers(docs):
        if container["name"] == "migrate":
            continue
        environ = otel_environment(container)
        assert environ["OTEL_EXPORTER_OTLP_PROTOCOL"] == protocol, name
        assert environ["OTEL_EXPORTER_OTLP_ENDPOINT"] == endpoint, name
        # What the pod's variables configure is the SDK's exporter of that protocol.
        environ.pop("OTEL_RESOURCE_ATTRIBUTES")
        provider = configure_tracing(chart, environ, set_global=False)
        assert isinstance(provider, TracerProvider)
        (processor,) = provider._active_span_processor._span_processors
        assert isinstance(processor, BatchSpanProcessor)
        assert isinstance(processor.span_exporter, RedactingExporter)
        assert isinstance(processor.span_exporter.wrapped, exporter)
        shutdown_tracing(provider)
    # Ports named by hand must open the endpoint's; without an endpoint nothing is opened.
    assert "do not open otel.endpoint's port" in refused(
        chart,
        f"otel.endpoint={endpoint}",
        f"otel.protocol={protocol}",
        "networkPolicy.egress.otlp.ports={4318,4319}"
        if port != 4318
        else "networkPolicy.egress.otlp.ports={4317}",
    )
    assert otlp_ports(render(chart)) is None
    assert otlp_ports(render(chart, "default", "networkPolicy.egress.otlp.ports={4317}")) == [4317]
    refused(chart, "otel.protocol=http/json")
    refused(chart, "otel.endpoint=http://collector.observability")  # no port to open


def test_helm_is_built_with_its_version_and_its_kubernetes(tmp_path: Path) -> None:
    """`helm version` names the release tools.sh builds, and without --kube-version Helm's
    default capabilities are its client-go's Kubernetes, which the charts' kubeVersion
    (>=1.29.0-0) accepts: built with Helm's own linker flags, not a bare `go install`."""
    tools = (ROOT / "infra" / "checks" / "tools.sh").read_text()
    (version,) = re.findall(r'^HELM_VERSION="(v[0-9.]+)"$', tools, re.MULTILINE)
    reported = subprocess.run(
        [helm(), "version", "--template", "{{ .Version }} {{ .GitCommit }} {{ .GitTreeState }}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert reported[0] == version
    assert reported[-1] == "clean"  # the commit too where the module proxy reports it
    # The build's recipe is part of the tool's path: a changed recipe builds anew.
    assert re.fullmatch(rf"helm-{re.escape(version)}-[0-9a-f]{{12}}", Path(helm()).parent.name)
    # A chart that prints the capabilities Helm renders with by default.
    chart = tmp_path / "capabilities"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(
        "apiVersion: v2\nname: capabilities\nversion: 0.1.0\nkubeVersion: '>=1.29.0-0'\n"
    )
    (chart / "templates" / "kube.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: kube}\n"
        "data: {version: {{ .Capabilities.KubeVersion.Version | quote }}}\n"
    )
    out = subprocess.run(
        [helm(), "template", "kube", str(chart)], check=True, capture_output=True, text=True
    ).stdout
    kube = yaml.safe_load(out)["data"]["version"]
    major, minor = (int(part) for part in re.findall(r"^v(\d+)\.(\d+)\.", kube)[0])
    assert (major, minor) >= (1, 29), kube
    # And the service charts render without --kube-version.
    for name in sorted(SETTINGS):
        build_dependencies(CHARTS / name)
        subprocess.run(
            [helm(), "template", name, str(CHARTS / name)], check=True, capture_output=True
        )


@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_a_spread_constraint_with_its_own_label_selector_keeps_it(
    chart: str, tmp_path: Path
) -> None:
    own = {"matchLabels": {"example.com/pool": "workers"}}
    values = tmp_path / "spread.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "topologySpreadConstraints": [
                    {
                        "maxSkew": 1,
                        "topologyKey": "zone",
                        "whenUnsatisfiable": "DoNotSchedule",
                        "labelSelector": own,
                    },
                    {
                        "maxSkew": 2,
                        "topologyKey": "kubernetes.io/hostname",
                        "whenUnsatisfiable": "ScheduleAnyway",
                    },
                ]
            }
        )
    )
    # Before, the chart appended its own labelSelector to such a constraint: a duplicate key,
    # which the API server refuses and a YAML reader resolves to the chart's.
    for deployment in of_kind(render(chart, "default", files=(values,)), "Deployment"):
        constraints = deployment["spec"]["template"]["spec"].get("topologySpreadConstraints")
        if constraints is None:
            continue  # ops and lag watcher: one pod each, nothing to spread
        assert constraints[0]["labelSelector"] == own
        selector = constraints[1]["labelSelector"]["matchLabels"]
        assert selector["app.kubernetes.io/instance"] == chart
        assert selector["app.kubernetes.io/component"] in {"worker", "relay", "consumer"}


@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_the_migration_job_takes_its_own_pod_annotations_when_set(chart: str) -> None:
    # A sidecar injector's annotation on every pod of the release, but for the Job, which
    # would never complete while the injected sidecar runs.
    injected = "podAnnotations.sidecar\\.example\\.com/inject=enabled"
    job = component(render(chart, "default", injected), "migrate")
    assert job["spec"]["template"]["metadata"]["annotations"] == {
        "sidecar.example.com/inject": "enabled"
    }
    own = component(
        render(
            chart,
            "default",
            injected,
            "migrations.podAnnotations.sidecar\\.example\\.com/inject=disabled",
        ),
        "migrate",
    )
    assert own["spec"]["template"]["metadata"]["annotations"] == {
        "sidecar.example.com/inject": "disabled"
    }
    deployments = of_kind(render(chart, "default", injected), "Deployment")
    assert all(
        d["spec"]["template"]["metadata"]["annotations"]["sidecar.example.com/inject"] == "enabled"
        for d in deployments
    )


@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_the_test_pod_pulls_with_the_releases_pull_secrets(chart: str) -> None:
    docs = render(chart, OVERLAY)
    (pod,) = of_kind(docs, "Pod")
    assert pod["spec"]["imagePullSecrets"] == overlay(chart)["imagePullSecrets"]


@pytest.mark.parametrize("chart", sorted(SETTINGS))
def test_no_pod_gets_service_links(chart: str) -> None:
    """A Service named <release>-metrics would set <PREFIX>_METRICS_PORT=tcp://... in every
    pod of the namespace: the service's own setting, refused at start where unset (the
    migration Job of an upgrade, found on a real cluster)."""
    docs = render(chart, OVERLAY)
    specs = [d["spec"]["template"]["spec"] for d in docs if d["kind"] in {"Deployment", "Job"}]
    specs += [pod["spec"] for pod in of_kind(docs, "Pod")]
    assert specs
    assert all(spec["enableServiceLinks"] is False for spec in specs)
