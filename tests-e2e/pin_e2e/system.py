"""One scenario's system: its two databases, its consumer group, its service processes.

In either topology (``pin_e2e.stack``): host processes of the development environment, or
containers of the project's images (``PIN_E2E_TOPOLOGY=containers``), the scenarios alike."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from pin_contracts import (
    AGENT_MEMBERSHIP_CHANGED,
    IDENTITY_MEMBERSHIP_DLQ,
    REWARDS_MEMBERSHIP_CONSUMER_GROUP,
    USER_ACCESS_CHANGED,
)
from pin_e2e.stack import Servers, image, topology
from pin_testkit.databases import create_database
from pin_testkit.ports import free_port
from pin_testkit.records import Offsets, Record, commit_group_offsets, end_offsets, read_topic
from pin_testkit.runtime_roles import runtime_dsn
from pin_testkit.service import CommandResult, ServiceProcess, run_cli, service_environment
from pin_testkit.service_container import ServiceContainer, run_cli_container

__all__ = [
    "CONSUMER",
    "IDENTITY_FANOUT",
    "IDENTITY_OPERATOR",
    "IDENTITY_TEMPLATE",
    "PRODUCER",
    "RELAY",
    "REWARDS_MEMBERSHIP",
    "REWARDS_OPERATOR",
    "REWARDS_TEMPLATE",
    "WORKER",
    "WORKER_WITH_RELAY",
    "System",
    "cli",
    "process_environment",
]

IDENTITY_FANOUT: Final = "identity-fanout"
REWARDS_MEMBERSHIP: Final = "rewards-membership"

# Every process logs in as its runtime role (pin_testkit.runtime_roles; the conftest makes
# the logins): a statement its role was not granted fails the scenario.
WORKER: Final = ("identity_fanout_worker",)
WORKER_WITH_RELAY: Final = ("identity_fanout_worker", "identity_fanout_relay")
RELAY: Final = ("identity_fanout_relay",)
PRODUCER: Final = ("identity_membership_producer",)
IDENTITY_OPERATOR: Final = ("identity_fanout_operator",)
CONSUMER: Final = ("rewards_membership_consumer",)
REWARDS_OPERATOR: Final = ("rewards_membership_operator",)

IDENTITY_TEMPLATE: Final = "e2e_identity_template"
REWARDS_TEMPLATE: Final = "e2e_rewards_template"

# Faster than the spec defaults where a scenario would otherwise wait on a timer: the worker
# polls the queue every second (NOTIFY wakes it anyway), and a crashed worker's lease lapses
# in seconds instead of 5 minutes. BatchSize 100 makes "mid-task" a point among 25 batches.
WORKER_DEFAULTS: Final = {
    "BATCH_SIZE": "100",
    "POLLING_INTERVAL": "1s",
    "MAX_LEASE_DURATION": "8s",
    "INLINE_FANOUT_THRESHOLD": "50",
    "RELAY_POLL_INTERVAL": "250ms",
    "LOG_LEVEL": "WARNING",
}
CONSUMER_DEFAULTS: Final = {
    "BATCH_SIZE": "50",
    "POLL_TIMEOUT": "250ms",
    "RETRY_INITIAL": "500ms",
    "RETRY_MAX": "5s",
    "LAG_INTERVAL": "1s",
    "LOG_LEVEL": "WARNING",
    # A killed consumer's partitions move on after this, not after Kafka's default 45 s; it
    # is also shorter than scenario 5's outage, so the consumer loses its partitions then.
    "KAFKA_SESSION_TIMEOUT": "8s",
}


def process_environment(settings: Mapping[str, str]) -> dict[str, str]:
    """A service process's environment: the test session's minus anything that would configure
    the services behind the scenario's back (another suite's DSNs, tracing exporters), and
    the scenario's ``settings``. Rich tables of the CLIs unfolded, for the assertions."""
    base = service_environment(("IDENTITY_FANOUT_", "REWARDS_MEMBERSHIP_", "OTEL_"), COLUMNS="240")
    return base | dict(settings)


def cli(program: str, args: Sequence[str], env: Mapping[str, str]) -> CommandResult:
    """A CLI command as the topology runs it: the console script, or the image's."""
    if topology() == "containers":
        return run_cli_container(image(program), args, env)
    return run_cli(program, args, env)


@dataclass
class System:
    """Both services of one scenario on the e2e servers, checked from the outside."""

    servers: Servers
    name: str
    workdir: Path
    identity_dsn: str = ""
    rewards_dsn: str = ""
    group: str = ""
    access_start: Offsets = field(default_factory=dict)
    membership_start: Offsets = field(default_factory=dict)
    dlq_start: Offsets = field(default_factory=dict)
    processes: list[ServiceProcess] = field(default_factory=list)

    @classmethod
    def create(cls, servers: Servers, name: str, workdir: Path) -> System:
        admin = servers.services.postgres_dsn
        system = cls(servers, name, workdir)
        system.identity_dsn = create_database(
            admin, f"e2e_{name}_identity", template=IDENTITY_TEMPLATE
        )
        system.rewards_dsn = create_database(
            admin, f"e2e_{name}_rewards", template=REWARDS_TEMPLATE
        )
        # The scenario's own consumer group, starting at the scenario's first record: earlier
        # scenarios' membership events stay on the shared topic.
        system.group = f"{REWARDS_MEMBERSHIP_CONSUMER_GROUP}-e2e-{name}"
        bootstrap = servers.services.kafka_bootstrap
        system.access_start = end_offsets(bootstrap, USER_ACCESS_CHANGED.name)
        system.membership_start = end_offsets(bootstrap, AGENT_MEMBERSHIP_CHANGED.name)
        system.dlq_start = end_offsets(bootstrap, IDENTITY_MEMBERSHIP_DLQ.name)
        commit_group_offsets(
            bootstrap, system.group, AGENT_MEMBERSHIP_CHANGED.name, system.membership_start
        )
        return system

    @property
    def bootstrap(self) -> str:
        return self.servers.services.kafka_bootstrap

    # -- settings -------------------------------------------------------------------------

    def identity_env(self, login: tuple[str, ...], **settings: str) -> dict[str, str]:
        """Settings of an identity-fanout process logging in as the `login` groups' user."""
        values = {
            **WORKER_DEFAULTS,
            "DATABASE_DSN": runtime_dsn(self.identity_dsn, *login),
            "KAFKA_BOOTSTRAP": self.bootstrap,
            **settings,
        }
        return {f"IDENTITY_FANOUT_{k}": v for k, v in values.items()}

    def rewards_env(self, login: tuple[str, ...], **settings: str) -> dict[str, str]:
        """Settings of a rewards-membership process logging in as the `login` groups' user."""
        values = {
            **CONSUMER_DEFAULTS,
            "DATABASE_DSN": runtime_dsn(self.rewards_dsn, *login),
            "KAFKA_BOOTSTRAP": self.bootstrap,
            "GROUP_ID": self.group,
            **settings,
        }
        return {f"REWARDS_MEMBERSHIP_{k}": v for k, v in values.items()}

    # -- processes ------------------------------------------------------------------------

    def process(
        self, label: str, program: str, args: Sequence[str], env: Mapping[str, str], port: int
    ) -> ServiceProcess:
        log_path = self.workdir / f"{label}.log"
        environment = process_environment(env)
        process: ServiceProcess
        if topology() == "containers":
            process = ServiceContainer(
                name=label,
                program=program,
                args=tuple(args),
                env=environment,
                metrics_port=port,
                log_path=log_path,
                image=image(program),
            )
        else:
            process = ServiceProcess(
                name=label,
                program=program,
                args=tuple(args),
                env=environment,
                metrics_port=port,
                log_path=log_path,
            )
        self.processes.append(process)
        return process

    def worker(self, label: str = "worker", *args: str, **settings: str) -> ServiceProcess:
        """``identity-fanout worker`` (with its relay thread unless --no-relay), not started."""
        port = free_port()
        login = WORKER if "--no-relay" in args else WORKER_WITH_RELAY
        env = self.identity_env(login, METRICS_HOST="127.0.0.1", METRICS_PORT=str(port), **settings)
        return self.process(label, IDENTITY_FANOUT, ["worker", *args], env, port)

    def relay(self, label: str = "relay", **settings: str) -> ServiceProcess:
        """``identity-fanout relay``: the relay as its own process (the chart's topology)."""
        port = free_port()
        env = self.identity_env(RELAY, METRICS_HOST="127.0.0.1", METRICS_PORT=str(port), **settings)
        return self.process(label, IDENTITY_FANOUT, ["relay"], env, port)

    def consumer(self, label: str = "consumer", **settings: str) -> ServiceProcess:
        """``rewards-membership consume``, not started yet."""
        port = free_port()
        env = self.rewards_env(
            CONSUMER, METRICS_HOST="127.0.0.1", METRICS_PORT=str(port), **settings
        )
        return self.process(label, REWARDS_MEMBERSHIP, ["consume"], env, port)

    def identity_cli(self, *args: str) -> CommandResult:
        """`memberships ...` as the membership producer, the runbook as the operator."""
        login = PRODUCER if args[:1] == ("memberships",) else IDENTITY_OPERATOR
        return cli(IDENTITY_FANOUT, args, process_environment(self.identity_env(login)))

    def rewards_cli(self, *args: str, **settings: str) -> CommandResult:
        """The rewards tooling as the operator; ``settings`` override the system's."""
        env = process_environment(self.rewards_env(REWARDS_OPERATOR, **settings))
        return cli(REWARDS_MEMBERSHIP, args, env)

    def stop_all(self) -> None:
        for process in reversed(self.processes):
            process.cleanup()

    # -- topics ---------------------------------------------------------------------------

    def access_records(self) -> list[Record]:
        return read_topic(self.bootstrap, USER_ACCESS_CHANGED.name, self.access_start)

    def membership_records(self) -> list[Record]:
        return read_topic(self.bootstrap, AGENT_MEMBERSHIP_CHANGED.name, self.membership_start)

    def dlq_records(self) -> list[Record]:
        return read_topic(self.bootstrap, IDENTITY_MEMBERSHIP_DLQ.name, self.dlq_start)
