"""What a process is: its service's version, the revision it was built from, the contract
package it speaks and the Python it runs on.

One shape for the three places an operator asks: `<service> --version`, the
`<service>_build_info` metric (a dashboard's "which build runs where", an alert's "two
versions in one group") and the spans' resource (`service.version`). The revision is the
image's (`PIN_BUILD_REVISION`, set from the build's git revision in `infra/docker/Dockerfile`
next to its OCI labels); a process outside an image says `unknown`.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Final

from prometheus_client import CollectorRegistry, Info
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

__all__ = ["REVISION_ENV", "BuildInfo", "register_process_metrics"]

REVISION_ENV: Final = "PIN_BUILD_REVISION"
UNKNOWN: Final = "unknown"


def _version_of(distribution: str) -> str:
    try:
        return version(distribution)
    except PackageNotFoundError:  # run from a source tree that was never installed
        return UNKNOWN


@dataclass(frozen=True, slots=True)
class BuildInfo:
    """The build of one service's process (`of`), as `--version` prints it (`line`)."""

    service: str
    version: str
    revision: str
    contracts_version: str
    python_version: str

    @classmethod
    def of(cls, service: str, env: Mapping[str, str] | None = None) -> BuildInfo:
        """`service`: its distribution's name (the console script's, e.g. identity-fanout)."""
        env = os.environ if env is None else env
        return cls(
            service=service,
            version=_version_of(service),
            revision=env.get(REVISION_ENV, "").strip() or UNKNOWN,
            contracts_version=_version_of("pin-contracts"),
            python_version=platform.python_version(),
        )

    def line(self) -> str:
        return (
            f"{self.service} {self.version} (revision {self.revision}, "
            f"pin-contracts {self.contracts_version}, Python {self.python_version})"
        )

    @property
    def metric_name(self) -> str:
        """`<service>_build` (exported as `<service>_build_info`, the Prometheus idiom)."""
        return self.service.replace("-", "_") + "_build"

    def labels(self) -> dict[str, str]:
        labels = asdict(self)
        del labels["service"]  # in the metric's name
        return labels


def register_process_metrics(registry: CollectorRegistry, build: BuildInfo) -> None:
    """The standard `process_*` (memory against the pod's limit, CPU, file descriptors) and
    `python_*` collectors, which a private registry does not have, and the build-info metric.
    """
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    Info(build.metric_name, "The build this process runs", registry=registry).info(build.labels())
