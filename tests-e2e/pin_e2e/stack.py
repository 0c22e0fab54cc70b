"""The containers topology: the scenarios on the compose stack (infra/compose).

``PIN_E2E_TOPOLOGY=containers`` (what ``make e2e-compose`` sets, after ``make stack``) runs
the same scenarios with every service process a container of the project's image
(``pin_testkit.service_container``) and the stack's PostgreSQL and Kafka containers as the
suite's servers: ``stop_kafka()`` / ``stop_postgres()`` are ``docker stop`` of the server's
container (Kafka's SIGTERM, PostgreSQL's fast shutdown; ``immediate`` is ``docker kill
--signal SIGQUIT``), ``restart_stopped()`` is ``docker start`` of the same container, same
ports, same volume, awaited until the server answers. The stack's own service containers
are stopped first (``make stack`` has shown them healthy): the scenarios run theirs.
``processes`` (the default) is the host-process topology of ``pin_testkit.private_servers``.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from typing import Final, Protocol

import psycopg
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from pin_testkit.discovery import Services
from pin_testkit.ports import listens
from pin_testkit.waiting import wait_until

TOPOLOGY_VAR: Final = "PIN_E2E_TOPOLOGY"
TOPOLOGIES: Final = ("processes", "containers")
PROJECT: Final = "pin-stack"
RESTART_TIMEOUT: Final = 180.0
# PostgreSQL's shutdown modes as signals to its container's main process.
STOP_SIGNALS: Final = {"fast": "SIGINT", "immediate": "SIGQUIT", "smart": "SIGTERM"}
# The stack's own service processes: stopped while the scenarios run their own.
STACK_PROCESSES: Final = (
    "identity-worker-1",
    "identity-worker-2",
    "identity-relay",
    "identity-lag-watcher",
    "rewards-consumer",
    "rewards-lag-watcher",
)


class Addresses(Protocol):
    @property
    def postgres_dsn(self) -> str: ...
    @property
    def kafka_bootstrap(self) -> str: ...


class Servers(Protocol):
    """What a scenario does to its servers, in either topology."""

    stopped: set[str]

    @property
    def services(self) -> Addresses: ...

    def stop_kafka(self) -> float: ...
    def stop_postgres(self, *, mode: str = "fast") -> float: ...
    def restart_stopped(self) -> float: ...
    def close(self) -> None: ...


def topology() -> str:
    chosen = os.environ.get(TOPOLOGY_VAR, "").strip() or "processes"
    if chosen not in TOPOLOGIES:
        raise ValueError(f"{TOPOLOGY_VAR}={chosen!r}: expected one of {', '.join(TOPOLOGIES)}")
    return chosen


def image(program: str) -> str:
    """The image a service runs from: PIN_<SERVICE>_IMAGE, else ``<service>:local``."""
    var = f"PIN_{program.upper().replace('-', '_')}_IMAGE"
    return os.environ.get(var, "").strip() or f"{program}:local"


def _docker(*args: str) -> str:
    done = subprocess.run(
        ["docker", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)} -> {done.returncode}: {done.stderr}")
    return done.stdout.strip()


def _container(service: str) -> str:
    """The running stack's container of a compose service."""
    found = _docker(
        "ps", "--all", "--quiet",
        "--filter", f"label=com.docker.compose.project={PROJECT}",
        "--filter", f"label=com.docker.compose.service={service}",
    )  # fmt: skip
    if not found:
        raise RuntimeError(f"no {service} container of the {PROJECT} stack: run `make stack`")
    return found.splitlines()[0]


@dataclass
class StackServers:
    """The compose stack's PostgreSQL and Kafka, as the suite's servers."""

    services: Services
    stopped: set[str] = field(default_factory=set)

    @classmethod
    def attach(cls) -> StackServers:
        pg_port = os.environ.get("PIN_STACK_POSTGRES_PORT", "25432")
        kafka_port = os.environ.get("PIN_STACK_KAFKA_PORT", "29092")
        services = Services(
            postgres_dsn=f"postgresql://pin:pin@127.0.0.1:{pg_port}/postgres",
            kafka_bootstrap=f"127.0.0.1:{kafka_port}",
            source=f"compose stack {PROJECT}",
        )
        servers = cls(services)
        servers._await_answers()
        # The scenarios start their processes with their own settings; the stack's consumer,
        # in the production group, would also take the scenarios' poison records.
        for service in STACK_PROCESSES:
            _docker("stop", _container(service))
        return servers

    def stop_kafka(self) -> float:
        started = time.monotonic()
        self.stopped.add("kafka")
        _docker("stop", "--time", "60", _container("kafka"))
        return time.monotonic() - started

    def stop_postgres(self, *, mode: str = "fast") -> float:
        started = time.monotonic()
        self.stopped.add("postgres")
        container = _container("postgres")
        _docker("kill", "--signal", STOP_SIGNALS[mode], container)
        wait_until(
            lambda: _docker("inspect", "--format", "{{.State.Running}}", container) == "false",
            timeout=60,
            what=f"PostgreSQL's container stopped ({mode})",
            interval=0.2,
        )
        return time.monotonic() - started

    def restart_stopped(self) -> float:
        started = time.monotonic()
        for service in sorted(self.stopped):
            _docker("start", _container(service))
        self._await_answers()
        self.stopped.clear()
        return time.monotonic() - started

    def close(self) -> None:
        """The stack outlives the suite: `make stack-down` removes it."""

    def _await_answers(self) -> None:
        wait_until(self._postgres_answers, RESTART_TIMEOUT, "PostgreSQL answers", interval=0.5)
        wait_until(self._kafka_answers, RESTART_TIMEOUT, "Kafka answers", interval=0.5)

    def _postgres_answers(self) -> bool:
        try:
            with psycopg.connect(self.services.postgres_dsn, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
        except psycopg.OperationalError:
            return False
        return True

    def _kafka_answers(self) -> bool:
        host, _, port = self.services.kafka_bootstrap.rpartition(":")
        if not listens(int(port), host):
            return False
        admin = AdminClient({"bootstrap.servers": self.services.kafka_bootstrap, "log_level": 0})
        try:
            admin.list_topics(timeout=3)
        except KafkaException:
            return False
        return True
