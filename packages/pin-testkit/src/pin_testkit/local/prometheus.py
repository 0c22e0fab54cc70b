"""A real Prometheus server on loopback, loaded with the repository's alert rules.

Tests and the end-to-end suite use it to see what an operator's Prometheus would see: it
scrapes the services' `/metrics`, evaluates `infra/monitoring/rules/*.rules.yml`, and answers
which alerts are pending or firing. Targets are a file-based service discovery file, so a
test adds a process started after the server without a reload.

The binary is Debian's (`infra/checks/tools.sh prometheus` extracts it once per machine).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Self

from pin_testkit.local.errors import LocalInfraError
from pin_testkit.local.procs import write_atomic
from pin_testkit.local.tool_process import ToolProcess, ToolServer
from pin_testkit.local.tools import repo_root, tool_binary
from pin_testkit.ports import free_port

__all__ = ["PrometheusServer", "prometheus_binary", "repository_rule_files"]

PROMETHEUS_ENV: Final = "PIN_PROMETHEUS"
"""Path of a Prometheus server binary to use instead of the tools cache's."""
READY_TIMEOUT: Final = 60.0


def prometheus_binary() -> Path:
    """`$PIN_PROMETHEUS`, or the tools cache's binary (extracted on first use)."""
    return tool_binary("prometheus", PROMETHEUS_ENV)


def repository_rule_files() -> list[Path]:
    """Every alert rule file of `infra/monitoring/rules/`."""
    return sorted((repo_root() / "infra" / "monitoring" / "rules").glob("*.rules.yml"))


class PrometheusServer(ToolServer):
    """`prometheus` scraping `targets` (job -> host:port) every `scrape_interval`.

    Evaluation runs as often as scraping, so an alert's `for:` is the only delay between a
    metric crossing its threshold and the alert firing. Use as a context manager.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        rule_files: Sequence[Path] | None = None,
        scrape_interval: str = "1s",
        binary: Path | None = None,
    ) -> None:
        self._workdir = workdir
        self._rule_files = list(repository_rule_files() if rule_files is None else rule_files)
        self._interval = scrape_interval
        self._binary = binary
        self._targets: dict[str, list[str]] = {}
        self._process: ToolProcess | None = None

    def start(self) -> Self:
        self._workdir.mkdir(parents=True, exist_ok=True)
        self._write_targets()
        config = {
            "global": {"scrape_interval": self._interval, "evaluation_interval": self._interval},
            "rule_files": [str(path) for path in self._rule_files],
            "scrape_configs": [
                {
                    "job_name": "pin",
                    "file_sd_configs": [
                        {"files": [str(self._targets_file)], "refresh_interval": "1s"}
                    ],
                }
            ],
        }
        config_file = self._workdir / "prometheus.yml"
        # JSON is YAML: no YAML library needed to write the configuration.
        write_atomic(config_file, json.dumps(config, indent=2))
        self.port = free_port()
        self._process = ToolProcess("prometheus", self._workdir / "prometheus.log", grace=10.0)
        self._process.start(
            [
                str(self._binary or prometheus_binary()),
                f"--config.file={config_file}",
                f"--storage.tsdb.path={self._workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
            ]
        )
        self._process.await_ready(self._ready, timeout=READY_TIMEOUT, interval=0.2)
        return self

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            process.stop()

    def scrape(self, job: str, address: str) -> None:
        """Add `address` (host:port of a /metrics endpoint) under the label job=`job`."""
        self._targets.setdefault(job, []).append(address)
        self._write_targets()

    @property
    def _targets_file(self) -> Path:
        return self._workdir / "targets.json"

    def _write_targets(self) -> None:
        groups = [
            {"targets": addresses, "labels": {"job": job, "namespace": "pin-e2e"}}
            for job, addresses in sorted(self._targets.items())
        ]
        write_atomic(self._targets_file, json.dumps(groups))

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:  # noqa: S310
                return bool(response.status == 200)  # noqa: PLR2004
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    # -- the HTTP API ---------------------------------------------------------------------

    def _api(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=5) as response:  # noqa: S310
            body = json.load(response)
        if body.get("status") != "success":
            raise LocalInfraError(f"prometheus {path}: {body}")
        return body["data"]

    def alerts(self) -> list[dict[str, Any]]:
        """Every pending or firing alert (labels, state, activeAt, value)."""
        data: list[dict[str, Any]] = self._api("alerts")["alerts"]
        return data

    def firing(self) -> set[str]:
        """Names of the alerts firing now."""
        return {a["labels"]["alertname"] for a in self.alerts() if a["state"] == "firing"}

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector: `[{"metric": {...}, "value": [ts, "v"]}, ...]`."""
        result: list[dict[str, Any]] = self._api("query", {"query": expr})["result"]
        return result

    def targets_up(self) -> int:
        """How many targets were scraped successfully at their last scrape."""
        return sum(1 for t in self._api("targets")["activeTargets"] if t["health"] == "up")
