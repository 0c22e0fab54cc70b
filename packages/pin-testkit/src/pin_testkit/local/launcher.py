"""ensure_up / down / status: the two local servers as one unit."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pin_runtime.kafka import TopicSpec
from pin_testkit.local.errors import LocalInfraError
from pin_testkit.local.kafka import Kafka, KafkaSecurity, ensure_libs, find_java
from pin_testkit.local.layout import Layout, resolve_layout
from pin_testkit.local.postgres import (
    DATABASES,
    Postgres,
    RunAs,
    dsn,
    find_bindir,
    server_account,
)
from pin_testkit.local.procs import POLL_INTERVAL, Deadline, file_lock, pid_alive
from pin_testkit.local.secure import (
    add_scram_users,
    load_or_create_security,
    mark_users_created,
    secured_of,
    users_created,
)
from pin_testkit.local.state import (
    LocalState,
    load_state,
    plan_state,
    save_state,
    with_secure_ports,
)
from pin_testkit.local.topics import catalogue_topics, ensure_topics
from pin_testkit.runtime_roles import all_logins, ensure_login, runtime_dsn
from pin_testkit.secured import SecuredKafka

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 180.0
REUSE_PROBE = 10.0  # how long a live server gets to answer before it is restarted
IDENTITY_DB, REWARDS_DB = DATABASES


@dataclass(frozen=True, slots=True)
class LocalServices:
    """Addresses of the running local servers."""

    postgres_dsn: str  # superuser ``pin``, maintenance database ``postgres``
    identity_dsn: str  # database pin_identity
    rewards_dsn: str  # database pin_rewards
    kafka_bootstrap: str  # 127.0.0.1:PORT
    pg_port: int
    kafka_port: int
    state_dir: Path
    secured: SecuredKafka | None = None  # the SASL_SSL and mTLS listeners (`up --secure`)

    def dsn(self, database: str) -> str:
        """The superuser DSN of any database on the local server."""
        return dsn(self.pg_port, database)

    def runtime_dsns(self) -> dict[str, str]:
        """``PIN_POSTGRES_<GROUP>_DSN`` -> the DSN of that runtime role's login user, in its
        service's database (``pin_testkit.runtime_roles``; made by ``up``)."""
        return {
            f"PIN_POSTGRES_{'_AND_'.join(groups).upper()}_DSN": runtime_dsn(
                self.dsn(database), *groups
            )
            for database, groups in all_logins()
        }


@dataclass(frozen=True, slots=True)
class ServiceStatus:
    name: str
    address: str | None  # DSN or bootstrap address; None before the first ``up``
    pid: int | None  # live server process, if any
    answering: bool


@dataclass(frozen=True, slots=True)
class LocalStatus:
    state_dir: Path
    postgres: ServiceStatus
    kafka: ServiceStatus

    @property
    def up(self) -> bool:
        return self.postgres.answering and self.kafka.answering


def _security(layout: Layout, state: LocalState) -> KafkaSecurity | None:
    if state.kafka_sasl_port is None or state.kafka_ssl_port is None:
        return None
    return load_or_create_security(layout, state.kafka_sasl_port, state.kafka_ssl_port)


def services_of(layout: Layout, state: LocalState) -> LocalServices:
    security = _security(layout, state)
    bootstrap = f"127.0.0.1:{state.kafka_port}"
    return LocalServices(
        postgres_dsn=dsn(state.pg_port),
        identity_dsn=dsn(state.pg_port, IDENTITY_DB),
        rewards_dsn=dsn(state.pg_port, REWARDS_DB),
        kafka_bootstrap=bootstrap,
        pg_port=state.pg_port,
        kafka_port=state.kafka_port,
        state_dir=layout.state_dir,
        secured=None if security is None else secured_of(bootstrap, security),
    )


def _answers_soon(probe: Postgres | Kafka, seconds: float) -> bool:
    deadline = Deadline.after(seconds)
    while not probe.answers():
        if deadline.expired():
            return False
        time.sleep(POLL_INTERVAL)
    return True


def _begin_kafka(kafka: Kafka, layout: Layout) -> int | None:
    """Reuse a healthy broker (None) or start one and return its pid without waiting for it."""
    changed = kafka.write_config()
    pid = kafka.pid()
    if pid is not None:
        if not changed and _answers_soon(kafka, REUSE_PROBE):
            log.info("kafka: reusing pid %d on %s", pid, kafka.bootstrap)
            return None
        log.info("kafka: %s; restarting", "configuration changed" if changed else "not answering")
        kafka.stop()
    java = find_java()
    libs = ensure_libs(layout)
    if not kafka.storage.formatted():
        kafka.format(java, libs)
        if kafka.config.security is not None:  # the format wrote the SCRAM users
            mark_users_created(layout)
    return kafka.start(java, libs)


def _ensure_scram_users(kafka: Kafka, layout: Layout) -> None:
    """Storage formatted before secure mode was switched on: add the users to the metadata."""
    security = kafka.config.security
    if security is None or users_created(layout):
        return
    add_scram_users(kafka, find_java(), ensure_libs(layout), security)
    mark_users_created(layout)


def _ensure_postgres(pg: Postgres, bindir: Path, account: RunAs, deadline: Deadline) -> None:
    if not pg.initialised():
        pg.init(bindir, account)
    changed = pg.write_conf(account)
    rules_changed = pg.write_hba()
    if pg.running(bindir, account):
        if not changed and _answers_soon(pg, REUSE_PROBE):
            if rules_changed:
                pg.reload()  # new pg_hba.conf rules need no restart
            log.info("postgres: reusing the server on 127.0.0.1:%d", pg.port)
            return
        log.info(
            "postgres: %s; restarting", "configuration changed" if changed else "not answering"
        )
        pg.stop(bindir, account)
    pg.start(bindir, account, deadline)


def ensure_up(
    *,
    topics: Sequence[TopicSpec] | None = None,
    state_dir: Path | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    secure: bool = False,
) -> LocalServices:
    """Start (or reuse) the local PostgreSQL and Kafka, create databases and topics.

    Idempotent: servers recorded in the state directory that answer are reused; a dead one is
    restarted on its old port with its old data. ``topics`` defaults to the contracts catalogue.
    ``timeout`` bounds the start-up of the servers (not the one-time Maven download).
    ``secure`` adds the broker's SASL_SSL (SCRAM) and SSL (client certificate) listeners
    (``LocalServices.secured``); once added they stay for later calls of this state directory.
    """
    layout = resolve_layout(state_dir)
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    layout.state_dir.chmod(0o755)  # the PostgreSQL account must be able to traverse it
    with file_lock(layout.lock_file, timeout):
        state = plan_state(load_state(layout.state_file))
        if secure:
            state = with_secure_ports(state)
        save_state(layout.state_file, state)
        pg = Postgres(layout, state.pg_port)
        kafka = Kafka(
            layout,
            state.kafka_port,
            state.kafka_controller_port,
            state.kafka_cluster_id,
            _security(layout, state),
        )
        bindir, account = find_bindir(), server_account()  # fail before starting anything
        # The broker's JVM warms up while PostgreSQL is being prepared.
        kafka_pid = _begin_kafka(kafka, layout)
        deadline = Deadline.after(timeout)
        _ensure_postgres(pg, bindir, account, deadline)
        if kafka_pid is not None:
            try:
                kafka.wait_answering(kafka_pid, deadline)
            except BaseException:
                kafka.stop(grace=5.0)  # do not leave a broker that never came up behind
                raise
            log.info("kafka: answering on %s", kafka.bootstrap)
        _ensure_scram_users(kafka, layout)
        pg.create_databases()
        for _, groups in all_logins():
            ensure_login(dsn(state.pg_port), *groups)
        ensure_topics(kafka.bootstrap, catalogue_topics() if topics is None else topics)
        return services_of(layout, state)


def down(*, state_dir: Path | None = None) -> None:
    """Stop both servers (data is kept). Idempotent."""
    layout = resolve_layout(state_dir)
    if not layout.state_dir.is_dir():
        return
    with file_lock(layout.lock_file, DEFAULT_TIMEOUT):
        state = load_state(layout.state_file)
        if state is None:
            return
        errors: list[str] = []
        kafka = Kafka(layout, state.kafka_port, state.kafka_controller_port, state.kafka_cluster_id)
        try:
            kafka.stop()
        except LocalInfraError as exc:
            errors.append(str(exc))
        pg = Postgres(layout, state.pg_port)
        if _postmaster_pid(layout) is not None:
            try:
                pg.stop(find_bindir(), server_account())
            except LocalInfraError as exc:
                errors.append(str(exc))
        if errors:
            raise LocalInfraError("; ".join(errors))


def _postmaster_pid(layout: Layout) -> int | None:
    try:
        first = (layout.pg_data / "postmaster.pid").read_text(encoding="ascii").splitlines()[0]
    except (OSError, IndexError):
        return None
    pid = int(first) if first.strip().isdigit() else 0
    return pid if pid_alive(pid) else None


def status(*, state_dir: Path | None = None) -> LocalStatus:
    """What runs now, without starting or stopping anything."""
    layout = resolve_layout(state_dir)
    state = load_state(layout.state_file) if layout.state_dir.is_dir() else None
    if state is None:
        return LocalStatus(
            state_dir=layout.state_dir,
            postgres=ServiceStatus("postgres", None, None, answering=False),
            kafka=ServiceStatus("kafka", None, None, answering=False),
        )
    services = services_of(layout, state)
    pg_pid = _postmaster_pid(layout)
    kafka = Kafka(layout, state.kafka_port, state.kafka_controller_port, state.kafka_cluster_id)
    kafka_pid = kafka.pid()
    return LocalStatus(
        state_dir=layout.state_dir,
        postgres=ServiceStatus(
            "postgres",
            services.postgres_dsn,
            pg_pid,
            answering=pg_pid is not None and Postgres(layout, state.pg_port).answers(),
        ),
        kafka=ServiceStatus(
            "kafka",
            services.kafka_bootstrap,
            kafka_pid,
            answering=kafka_pid is not None and kafka.answers(),
        ),
    )
