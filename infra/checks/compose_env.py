"""The compose stack runs each process as its chart runs it: same variables, same arguments.

    python compose_env.py [--compose FILE] [--set chart:key=value ...]

Each chart is rendered with its default values (`helm template`, Helm from tools.sh), and
every container of its Deployments and Jobs is compared with the compose services that stand
for it (COUNTERPARTS): the names of its variables (its `env` and the keys of the ConfigMaps it
reads with `envFrom`) must be exactly the compose service's `environment`, its `args` the
service's `command`, and where the chart makes the root filesystem read-only and drops every
capability, so must the service, as a numeric non-root user. A variable added to one and not
the other fails the check, naming it. Only the Kubernetes downward API's K8S_POD_NAME has no
compose counterpart. Exit code 1 with the differences.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

ROOT: Final = Path(__file__).resolve().parents[2]
COMPOSE: Final = ROOT / "infra" / "compose" / "docker-compose.yml"
CHARTS: Final = ("identity-fanout", "rewards-membership")
KUBE_VERSION: Final = "1.37.0"
# Chart workload (Deployment or Job name) -> the compose services that run it.
COUNTERPARTS: Final = {
    "identity-fanout-migrate": ("identity-migrate",),
    "identity-fanout-worker": ("identity-worker-1", "identity-worker-2"),
    "identity-fanout-relay": ("identity-relay",),
    "identity-fanout-lag-watcher": ("identity-lag-watcher",),
    "identity-fanout-ops": ("identity-ops",),
    "rewards-membership-migrate": ("rewards-migrate",),
    "rewards-membership-consumer": ("rewards-consumer",),
    "rewards-membership-lag-watcher": ("rewards-lag-watcher",),
    "rewards-membership-ops": ("rewards-ops",),
}
# The ops pods idle (`kubectl exec` runs the commands); compose runs each command instead.
IDLE: Final = frozenset({"identity-fanout-ops", "rewards-membership-ops"})
KUBERNETES_ONLY: Final = frozenset({"K8S_POD_NAME"})


@dataclass(frozen=True)
class Process:
    variables: frozenset[str]
    args: tuple[str, ...]
    hardened: bool


def helm() -> str:
    tools = ROOT / "infra" / "checks" / "tools.sh"
    return subprocess.run(  # noqa: S603 - the repository's own script
        [str(tools), "helm"], check=True, capture_output=True, text=True
    ).stdout.strip()


def render(chart: str, sets: list[str]) -> list[dict[str, Any]]:
    binary, path = helm(), str(ROOT / "infra" / "helm" / chart)
    # The library chart packaged from the tree as it is (charts/ is built, never kept).
    build = [binary, "dependency", "build", "--skip-refresh", path]
    subprocess.run(build, check=True, capture_output=True, text=True)  # noqa: S603
    command = [binary, "template", chart, path]
    command += ["--namespace", "pin", "--kube-version", KUBE_VERSION]
    for setting in sets:
        command += ["--set", setting]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout  # noqa: S603
    return [doc for doc in yaml.safe_load_all(out) if doc]


def chart_processes(manifests: list[dict[str, Any]]) -> dict[str, Process]:
    """Workload name -> its (first) container as a process."""
    config_maps = {
        doc["metadata"]["name"]: doc.get("data") or {}
        for doc in manifests
        if doc["kind"] == "ConfigMap"
    }
    found = {}
    for doc in manifests:
        if doc["kind"] not in ("Deployment", "Job"):
            continue
        container = doc["spec"]["template"]["spec"]["containers"][0]
        names = {env["name"] for env in container.get("env", [])}
        for source in container.get("envFrom", []):
            names |= set(config_maps[source["configMapRef"]["name"]])
        security = container.get("securityContext") or {}
        dropped = (security.get("capabilities") or {}).get("drop") or []
        found[doc["metadata"]["name"]] = Process(
            variables=frozenset(names - KUBERNETES_ONLY),
            args=tuple(container.get("args") or ()),
            hardened=bool(security.get("readOnlyRootFilesystem")) and "ALL" in dropped,
        )
    return found


def compose_process(service: dict[str, Any]) -> Process:
    user = str(service.get("user", ""))
    uid = user.partition(":")[0]
    return Process(
        variables=frozenset(service.get("environment") or {}),
        args=tuple(service.get("command") or ()),
        hardened=bool(service.get("read_only"))
        and "ALL" in (service.get("cap_drop") or [])
        and uid.isdigit()
        and int(uid) != 0,
    )


def differences(chart: dict[str, Process], services: dict[str, dict[str, Any]]) -> list[str]:
    problems = []
    for workload in sorted(set(chart) - set(COUNTERPARTS)):
        problems.append(f"chart workload {workload} has no compose service (COUNTERPARTS)")
    for workload, names in COUNTERPARTS.items():
        pod = chart.get(workload)
        if pod is None:
            problems.append(f"{workload}: not rendered by its chart")
            continue
        for name in names:
            if name not in services:
                problems.append(f"{workload}: compose service {name} is missing")
                continue
            ours = compose_process(services[name])
            for var in sorted(pod.variables - ours.variables):
                problems.append(f"{name}: lacks {var}, which the chart's {workload} sets")
            for var in sorted(ours.variables - pod.variables):
                problems.append(f"{name}: sets {var}, which the chart's {workload} does not")
            if workload not in IDLE and ours.args != pod.args:
                problems.append(f"{name}: command {list(ours.args)} != chart args {list(pod.args)}")
            if pod.hardened and not ours.hardened:
                problems.append(
                    f"{name}: must run read-only, with every capability dropped, as a "
                    f"numeric non-root user (as the chart's {workload})"
                )
    return problems


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compose", type=Path, default=COMPOSE)
    parser.add_argument("--set", action="append", default=[], help="chart:key=value")
    args = parser.parse_args(argv)
    chart: dict[str, Process] = {}
    for name in CHARTS:
        sets = [s.partition(":")[2] for s in args.set if s.partition(":")[0] == name]
        chart |= chart_processes(render(name, sets))
    services = yaml.safe_load(args.compose.read_text(encoding="utf-8"))["services"]
    problems = differences(chart, services)
    for problem in problems:
        sys.stderr.write(f"{args.compose}: {problem}\n")
    if problems:
        return 1
    sys.stdout.write(
        f"compose and charts agree: {len(COUNTERPARTS)} workloads, {len(services)} services\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
