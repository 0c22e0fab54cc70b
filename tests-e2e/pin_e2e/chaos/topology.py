"""The campaign's system in the chart's topology, each process behind proxies of its own.

Two fan-out workers (`worker --no-relay`), two relays as their own processes, two
membership consumers in one group (the real group name: the campaign's broker is its own),
the reference access-cache consumer, and each service's lag watcher (`lag-watch`), whose
view of the groups' lag the alerts read. Every process
reaches PostgreSQL through a Toxiproxy proxy of its own and Kafka through a listener of the
campaign's broker that advertises a proxy of its own, so a network fault hits exactly one
process's path to one dependency. The broker is a private one (the campaign SIGKILLs it);
PostgreSQL is the end-to-end suite's (the campaign restarts it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pin_contracts import CATALOGUE, REWARDS_MEMBERSHIP_CONSUMER_GROUP, USER_ACCESS_CHANGED
from pin_e2e.system import (
    CONSUMER,
    CONSUMER_DEFAULTS,
    IDENTITY_FANOUT,
    IDENTITY_TEMPLATE,
    RELAY,
    REWARDS_MEMBERSHIP,
    REWARDS_TEMPLATE,
    WORKER,
    WORKER_DEFAULTS,
    System,
    process_environment,
)
from pin_runtime.kafka import create_admin, ensure_topics
from pin_testkit.databases import create_database
from pin_testkit.local.kafka import ProxiedListener
from pin_testkit.local.toxiproxy import Proxy, ToxiproxyServer
from pin_testkit.ports import free_port
from pin_testkit.private import PrivateKafka
from pin_testkit.private_servers import PrivateServers
from pin_testkit.runtime_roles import runtime_dsn
from pin_testkit.service import ServiceProcess

__all__ = ["PROCESS_LABELS", "ChaosSystem", "Member"]

WORKERS: Final = ("worker-1", "worker-2")
RELAYS: Final = ("relay-1", "relay-2")
CONSUMERS: Final = ("consumer-1", "consumer-2")
ACCESS_CACHE: Final = "access-cache"
LAG_WATCHERS: Final = {
    "lag-watch-identity": IDENTITY_FANOUT,
    "lag-watch-rewards": REWARDS_MEMBERSHIP,
}
PROCESS_LABELS: Final = (*WORKERS, *RELAYS, *CONSUMERS, ACCESS_CACHE, *LAG_WATCHERS)
LAG_WATCH_INTERVAL: Final = "5s"

# Shards of 1,000 users make the large role a task of several shards for two workers; the
# outbox lanes are shared by both relays.
CHAOS_IDENTITY: Final = {
    **WORKER_DEFAULTS,
    "SHARD_SIZE": "1000",
    "OUTBOX_LANES": "8",
    "RELAY_DELIVERY_TIMEOUT": "10s",
    "DB_STATEMENT_TIMEOUT": "10s",
    "DB_LOCK_TIMEOUT": "3s",
    # Claims, splits, supersessions and the relays' lanes are logged at INFO: the timeline
    # a failed campaign needs.
    "LOG_LEVEL": "INFO",
}
CHAOS_REWARDS: Final = {
    **CONSUMER_DEFAULTS,
    "DB_STATEMENT_TIMEOUT": "10s",
    "DB_LOCK_TIMEOUT": "3s",
    # Rebalances and pauses are logged at INFO: the timeline a failed campaign needs.
    "LOG_LEVEL": "INFO",
}


@dataclass
class Member:
    """One process of the system, its proxies and its dependencies."""

    label: str
    process: ServiceProcess
    postgres: Proxy | None
    kafka: Proxy
    dependencies: tuple[str, ...]


@dataclass
class ChaosSystem:
    """The campaign's databases, broker, proxies and processes."""

    servers: PrivateServers
    broker: PrivateKafka
    toxiproxy: ToxiproxyServer
    workdir: Path
    base: System
    members: dict[str, Member] = field(default_factory=dict)
    postgres_down: bool = False
    """A PostgreSQL restart fault is under way (overlapping server faults wait for it)."""
    _listeners: list[ProxiedListener] = field(default_factory=list)

    @classmethod
    def create(
        cls,
        servers: PrivateServers,
        broker: PrivateKafka,
        toxiproxy: ToxiproxyServer,
        workdir: Path,
    ) -> ChaosSystem:
        admin = servers.services.postgres_dsn
        base = System(servers, "chaos", workdir)
        base.identity_dsn = create_database(admin, "e2e_chaos_identity", template=IDENTITY_TEMPLATE)
        base.rewards_dsn = create_database(admin, "e2e_chaos_rewards", template=REWARDS_TEMPLATE)
        base.group = REWARDS_MEMBERSHIP_CONSUMER_GROUP
        system = cls(servers, broker, toxiproxy, workdir, base, _listeners=list(broker.proxied))
        admin_client = create_admin(broker.bootstrap, client_id="chaos-setup")
        ensure_topics(admin_client, [(t.name, t.partitions, t.config()) for t in CATALOGUE])
        return system

    @property
    def bootstrap(self) -> str:
        """The broker's own address: for the campaign's reads, never behind a proxy."""
        return self.broker.bootstrap

    # -- processes ------------------------------------------------------------------------

    def _proxies(self, label: str, dsn: str | None) -> tuple[Proxy | None, Proxy]:
        listener = self._listeners.pop(0)
        kafka = self.toxiproxy.proxy(
            f"{label}-kafka", listener.upstream, port=listener.advertised_port
        )
        if dsn is None:
            return None, kafka
        params = conninfo_to_dict(dsn)
        postgres = self.toxiproxy.proxy(
            f"{label}-postgres", f"{params.get('host') or '127.0.0.1'}:{params['port']}"
        )
        return postgres, kafka

    def _member(
        self,
        label: str,
        program: str,
        args: list[str],
        *,
        postgres: Proxy | None,
        kafka: Proxy,
    ) -> Member:
        port = free_port()
        process = ServiceProcess(
            name=label,
            program=program,
            args=tuple(args),
            env={},
            metrics_port=port,
            log_path=self.workdir / f"{label}.log",
        )
        dependencies = ("kafka",) if postgres is None else ("postgres", "kafka")
        member = self.members[label] = Member(label, process, postgres, kafka, dependencies)
        return member

    def _identity(self, label: str, args: list[str], login: tuple[str, ...]) -> Member:
        postgres, kafka = self._proxies(label, self.base.identity_dsn)
        assert postgres is not None
        dsn = make_conninfo(runtime_dsn(self.base.identity_dsn, *login), port=postgres.port)
        settings = {**CHAOS_IDENTITY, "DATABASE_DSN": dsn, "KAFKA_BOOTSTRAP": kafka.address}
        member = self._member(label, IDENTITY_FANOUT, args, postgres=postgres, kafka=kafka)
        port = member.process.metrics_port
        settings |= {"METRICS_HOST": "127.0.0.1", "METRICS_PORT": str(port)}
        member.process.env = process_environment(
            {f"IDENTITY_FANOUT_{k}": v for k, v in settings.items()}
        )
        return member

    def build(self) -> None:
        """Every process of the topology, not started."""
        for label in WORKERS:
            self._identity(label, ["worker", "--no-relay"], WORKER)
        for label in RELAYS:
            self._identity(label, ["relay"], RELAY)
        for label in CONSUMERS:
            postgres, kafka = self._proxies(label, self.base.rewards_dsn)
            assert postgres is not None
            dsn = make_conninfo(runtime_dsn(self.base.rewards_dsn, *CONSUMER), port=postgres.port)
            member = self._member(
                label, REWARDS_MEMBERSHIP, ["consume"], postgres=postgres, kafka=kafka
            )
            settings = {
                **CHAOS_REWARDS,
                "DATABASE_DSN": dsn,
                "KAFKA_BOOTSTRAP": kafka.address,
                "GROUP_ID": self.base.group,
                "METRICS_HOST": "127.0.0.1",
                "METRICS_PORT": str(member.process.metrics_port),
            }
            member.process.env = process_environment(
                {f"REWARDS_MEMBERSHIP_{k}": v for k, v in settings.items()}
            )
        _, kafka = self._proxies(ACCESS_CACHE, None)
        member = self._member(ACCESS_CACHE, "python", [], postgres=None, kafka=kafka)
        member.process.args = ("-m", "pin_e2e.chaos.access_cache")
        member.process.env = process_environment(
            {
                "PIN_CHAOS_CACHE_BOOTSTRAP": kafka.address,
                "PIN_CHAOS_CACHE_TOPIC": USER_ACCESS_CHANGED.name,
                "PIN_CHAOS_CACHE_START": "{"
                + ",".join(f'"{p}": 0' for p in range(USER_ACCESS_CHANGED.partitions))
                + "}",
                "PIN_CHAOS_CACHE_APPLIED_LOG": str(self.applied_log),
                "PIN_CHAOS_CACHE_METRICS_PORT": str(member.process.metrics_port),
                "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
            }
        )

        for label, program in LAG_WATCHERS.items():
            _, kafka = self._proxies(label, None)
            member = self._member(label, program, ["lag-watch"], postgres=None, kafka=kafka)
            prefix = "IDENTITY_FANOUT_" if program == IDENTITY_FANOUT else "REWARDS_MEMBERSHIP_"
            watcher = {
                "KAFKA_BOOTSTRAP": kafka.address,
                "LAG_WATCH_INTERVAL": LAG_WATCH_INTERVAL,
                "LAG_WATCH_REQUEST_TIMEOUT": LAG_WATCH_INTERVAL,
                "METRICS_HOST": "127.0.0.1",
                "METRICS_PORT": str(member.process.metrics_port),
            }
            member.process.env = process_environment(
                {f"{prefix}{k}": v for k, v in watcher.items()}
            )

    @property
    def applied_log(self) -> Path:
        return self.workdir / "access-cache-applied.jsonl"

    def dependencies(self) -> dict[str, tuple[str, ...]]:
        return {label: m.dependencies for label, m in self.members.items()}

    def processes(self) -> list[ServiceProcess]:
        return [m.process for m in self.members.values()]

    def stop_all(self) -> None:
        for member in reversed(list(self.members.values())):
            member.process.cleanup()
