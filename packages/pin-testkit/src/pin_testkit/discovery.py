"""Where the real services of a test run come from.

Order, as the repository README promises: the environment variables
(``PIN_POSTGRES_DSN`` / ``PIN_KAFKA_BOOTSTRAP``), then testcontainers where a Docker engine
answers (``pin_testkit.containers``), then the local launcher (``pin-local up``: the
machine's PostgreSQL binaries and Kafka jars from Maven Central). A service that cannot be
had by any of them is an error, never a reason to skip: a test suite that silently skips its
integration tests is green without having tested anything.

``PIN_SERVICES`` names one source and allows no other: ``containers`` (the environment's
addresses are ignored, and no engine or a failed start is an error, never a fall back to
pin-local), ``local`` (pin-local only) or ``environment``; ``auto`` (the default) is the
order above, and a container start that failed before the fall back is named in the source.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

POSTGRES_DSN_VAR = "PIN_POSTGRES_DSN"
KAFKA_BOOTSTRAP_VAR = "PIN_KAFKA_BOOTSTRAP"

SERVICES_VAR = "PIN_SERVICES"
SOURCES = ("auto", "containers", "local", "environment")


class ServiceUnavailableError(RuntimeError):
    """No source could provide a service the tests need."""


@dataclass(frozen=True, slots=True)
class Services:
    """Addresses of the real services, and how they were found."""

    postgres_dsn: str
    kafka_bootstrap: str
    source: str


def docker_engine_answers(environ: Mapping[str, str] | None = None) -> bool:
    """True when a Docker engine answers ``GET /_ping`` within two seconds.

    Asked over a plain socket rather than the docker SDK, which leaves its socket to the
    garbage collector when no engine answers (a ResourceWarning, an error under
    ``filterwarnings = error``).
    """
    host = (environ if environ is not None else os.environ).get("DOCKER_HOST", "")
    try:
        if host.startswith("tcp://"):
            address, _, port = host.removeprefix("tcp://").rstrip("/").partition(":")
            sock = socket.create_connection((address, int(port or 2375)), timeout=2)
        else:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(2)
            try:
                sock.connect(host.removeprefix("unix://") or "/var/run/docker.sock")
            except OSError:
                sock.close()
                raise
        with sock:
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            status_line = sock.recv(64)
        return status_line.startswith(b"HTTP/1.") and b" 200 " in status_line
    except (OSError, ValueError):
        return False


def _from_containers(environ: Mapping[str, str], cleanups: list[Callable[[], Any]]) -> Services:
    from pin_testkit.containers import start_containers  # noqa: PLC0415 - only with an engine

    started = start_containers(environ, cleanups)
    return Services(
        postgres_dsn=started.postgres_dsn,
        kafka_bootstrap=started.kafka_bootstrap,
        source=f"testcontainers ({started.description})",
    )


def _from_launcher() -> Services:
    from pin_testkit.local import ensure_up  # noqa: PLC0415 - starts processes; only when needed

    local = ensure_up()
    return Services(
        postgres_dsn=local.postgres_dsn,
        kafka_bootstrap=local.kafka_bootstrap,
        source="pin-local",
    )


def environment_or_local(environ: Mapping[str, str] | None = None) -> Services:
    """The services the environment names, else the local launcher's (started if need be):
    what a benchmark or a tool run by hand uses, with nothing to clean up afterwards."""
    env = os.environ if environ is None else environ
    dsn = env.get(POSTGRES_DSN_VAR, "").strip()
    bootstrap = env.get(KAFKA_BOOTSTRAP_VAR, "").strip()
    if dsn and bootstrap:
        return Services(postgres_dsn=dsn, kafka_bootstrap=bootstrap, source="environment")
    return _from_launcher()


def _only_containers(environ: Mapping[str, str], cleanups: list[Callable[[], Any]]) -> Services:
    from pin_testkit.containers import engine_of  # noqa: PLC0415

    if not docker_engine_answers(environ):
        raise ServiceUnavailableError(
            f"{SERVICES_VAR}=containers but no Docker engine answers at {engine_of(environ)} "
            "(infra/docker/engine.sh up starts one)"
        )
    try:
        return _from_containers(environ, cleanups)
    except Exception as exc:
        raise ServiceUnavailableError(
            f"{SERVICES_VAR}=containers: testcontainers could not start the services: {exc}"
        ) from exc


def discover(
    environ: Mapping[str, str],
    cleanups: list[Callable[[], Any]],
) -> Services:
    """Find both services; ``cleanups`` receives what must be stopped at the end."""
    wanted = environ.get(SERVICES_VAR, "").strip() or "auto"
    if wanted not in SOURCES:
        raise ServiceUnavailableError(
            f"{SERVICES_VAR}={wanted!r}: expected one of {', '.join(SOURCES)}"
        )
    if wanted == "containers":
        return _only_containers(environ, cleanups)
    if wanted == "local":
        try:
            return _from_launcher()
        except Exception as exc:
            raise ServiceUnavailableError(f"{SERVICES_VAR}=local: pin-local: {exc}") from exc
    dsn = environ.get(POSTGRES_DSN_VAR, "").strip()
    bootstrap = environ.get(KAFKA_BOOTSTRAP_VAR, "").strip()
    if dsn and bootstrap:
        return Services(postgres_dsn=dsn, kafka_bootstrap=bootstrap, source="environment")
    if dsn or bootstrap or wanted == "environment":
        missing = KAFKA_BOOTSTRAP_VAR if dsn else POSTGRES_DSN_VAR
        raise ServiceUnavailableError(
            f"{missing} is not set while its sibling is: name both services or neither"
            if dsn or bootstrap
            else f"{SERVICES_VAR}=environment: set {POSTGRES_DSN_VAR} and {KAFKA_BOOTSTRAP_VAR}"
        )
    errors: list[str] = []
    if docker_engine_answers(environ):
        try:
            return _from_containers(environ, cleanups)
        except Exception as exc:
            errors.append(f"testcontainers: {exc}")
    try:
        local = _from_launcher()
    except Exception as exc:
        errors.append(f"pin-local: {exc}")
    else:
        if errors:  # said, not silent: the run's header names the failure
            return replace(local, source=f"pin-local (after {errors[0]})")
        return local
    raise ServiceUnavailableError(
        "no PostgreSQL/Kafka for the integration tests ("
        + "; ".join(errors)
        + f"). Set {POSTGRES_DSN_VAR} and {KAFKA_BOOTSTRAP_VAR}, or run `make up`."
    )
