"""Where the real services of a test run come from.

Order, as the repository README promises: the environment variables
(``PIN_POSTGRES_DSN`` / ``PIN_KAFKA_BOOTSTRAP``), then testcontainers where a Docker engine
answers, then the local launcher (``pin-local up``: the machine's PostgreSQL binaries and
Kafka jars from Maven Central). A service that cannot be had by any of them is an error,
never a reason to skip: a test suite that silently skips its integration tests is green
without having tested anything.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

POSTGRES_DSN_VAR = "PIN_POSTGRES_DSN"
KAFKA_BOOTSTRAP_VAR = "PIN_KAFKA_BOOTSTRAP"

# Images used only where a Docker engine answers; the versions match infra/compose.
POSTGRES_IMAGE = "postgres:15"
KAFKA_IMAGE = "apache/kafka:4.2.0"


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


def _from_containers(cleanups: list[Callable[[], Any]]) -> Services:
    from testcontainers.community.kafka import KafkaContainer  # noqa: PLC0415
    from testcontainers.community.postgres import PostgresContainer  # noqa: PLC0415

    pg = PostgresContainer(POSTGRES_IMAGE, username="pin", password="pin", dbname="postgres")  # noqa: S106 - throwaway container
    pg.start()
    cleanups.append(pg.stop)
    kafka = KafkaContainer(KAFKA_IMAGE).with_kraft()
    kafka.start()
    cleanups.append(kafka.stop)
    host, port = pg.get_container_host_ip(), pg.get_exposed_port(5432)
    return Services(
        postgres_dsn=f"postgresql://pin:pin@{host}:{port}/postgres",
        kafka_bootstrap=kafka.get_bootstrap_server(),
        source="testcontainers",
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


def discover(
    environ: Mapping[str, str],
    cleanups: list[Callable[[], Any]],
) -> Services:
    """Find both services; ``cleanups`` receives what must be stopped at the end."""
    dsn = environ.get(POSTGRES_DSN_VAR, "").strip()
    bootstrap = environ.get(KAFKA_BOOTSTRAP_VAR, "").strip()
    if dsn and bootstrap:
        return Services(postgres_dsn=dsn, kafka_bootstrap=bootstrap, source="environment")
    if dsn or bootstrap:
        missing = KAFKA_BOOTSTRAP_VAR if dsn else POSTGRES_DSN_VAR
        raise ServiceUnavailableError(
            f"{missing} is not set while its sibling is: name both services or neither"
        )
    errors: list[str] = []
    if docker_engine_answers(environ):
        try:
            return _from_containers(cleanups)
        except Exception as exc:
            errors.append(f"testcontainers: {exc}")
    try:
        return _from_launcher()
    except Exception as exc:
        errors.append(f"pin-local: {exc}")
    raise ServiceUnavailableError(
        "no PostgreSQL/Kafka for the integration tests ("
        + "; ".join(errors)
        + f"). Set {POSTGRES_DSN_VAR} and {KAFKA_BOOTSTRAP_VAR}, or run `make up`."
    )
