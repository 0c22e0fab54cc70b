"""Scenario 9: secrets never leave a process, whatever it logs, serves or traces.

Each process kind (`worker`, `relay`, `consume`) runs at DEBUG with spans printed to its
output (`OTEL_TRACES_EXPORTER=console`), a password in its database DSN and a SASL password
for a broker that requires SCRAM over TLS: once with the database reachable (work flows: a
membership change is published and applied), once with it unreachable (the processes retry
and report themselves degraded). Neither password appears in any output line, `/metrics`,
`/readyz` or span attribute (spans are part of the output).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http import HTTPStatus

import psycopg
import pytest
from pin_e2e.checks import PlannedChange
from pin_e2e.report import Recorder
from pin_e2e.steps import projection_converged, record_changes
from pin_e2e.system import CONSUMER, IDENTITY_FANOUT, RELAY, REWARDS_MEMBERSHIP, WORKER, System
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pin_contracts import CATALOGUE
from pin_runtime.kafka import create_admin, ensure_topics
from pin_testkit.ports import free_port
from pin_testkit.secured import SecuredKafka
from pin_testkit.service import ServiceProcess
from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Secrets:
    database_password: str
    sasl_password: str

    def found_in(self, text: str) -> list[str]:
        return [name for name, s in vars(self).items() if s in text]


def with_password(dsn: str, user: str, password: str, *, port: int | None = None) -> str:
    """``dsn`` logging in as ``user`` with ``password`` (on another ``port`` if given)."""
    extra: dict[str, str | int] = {"user": user, "password": password}
    if port is not None:
        extra["port"] = port
    return make_conninfo(dsn, **extra)


@pytest.fixture
def login_with_password(system_s9: System) -> Iterator[tuple[str, str]]:
    """A login role of the e2e PostgreSQL with a password: (user, password). A member of the
    runtime roles of the processes it runs (worker, relay, consumer), nothing more."""
    user, password = f"leak_probe_{uuid.uuid4().hex[:8]}", f"pw-{uuid.uuid4().hex}"
    admin = system_s9.servers.services.postgres_dsn
    groups = (*WORKER, *RELAY, *CONSUMER)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE {}").format(
                sql.Identifier(user),
                sql.Literal(password),
                sql.SQL(", ").join(sql.Identifier(g) for g in groups),
            )
        )
    yield user, password
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(user)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(user)))


@pytest.fixture
def system_s9(make_system: Callable[[str], System]) -> System:
    return make_system("s9")


def start_all(
    system: System,
    secured: SecuredKafka,
    identity_dsn: str,
    rewards_dsn: str,
    label: str,
) -> list[ServiceProcess]:
    debug = {"LOG_LEVEL": "DEBUG", "METRICS_HOST": "127.0.0.1"}
    tracing = {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": f"leak-{label}"}
    kinds = (
        ("worker", IDENTITY_FANOUT, ["worker", "--no-relay"], "IDENTITY_FANOUT_", identity_dsn),
        ("relay", IDENTITY_FANOUT, ["relay"], "IDENTITY_FANOUT_", identity_dsn),
        ("consumer", REWARDS_MEMBERSHIP, ["consume"], "REWARDS_MEMBERSHIP_", rewards_dsn),
    )
    processes = []
    for kind, program, args, prefix, dsn in kinds:
        port = free_port()
        base = (
            system.identity_env(WORKER)
            if program == IDENTITY_FANOUT
            else system.rewards_env(CONSUMER)
        )
        env = {
            **base,
            **{prefix + k: v for k, v in debug.items()},
            prefix + "METRICS_PORT": str(port),
            prefix + "DATABASE_DSN": dsn,
            **secured.environment(prefix),
            **tracing,
        }
        processes.append(system.process(f"{label}-{kind}", program, args, env, port).start())
    return processes


def exposed(process: ServiceProcess) -> str:
    """Everything the process showed: its output so far, /metrics and /readyz."""
    texts = [process.log_text()]
    for path in ("/metrics", "/readyz", "/healthz"):
        status, body = process.get(path)
        assert status in {HTTPStatus.OK, HTTPStatus.SERVICE_UNAVAILABLE}, (path, status)
        texts.append(body)
    return "\n".join(texts)


def stop_showing_nothing(processes: list[ServiceProcess], secrets: Secrets) -> None:
    """Each process shows no secret in what it serves and has logged, stops cleanly (exit 0)
    on SIGTERM, and shows none on its way out either."""
    for process in processes:
        leaks = secrets.found_in(exposed(process))
        assert not leaks, f"{process.name} shows {leaks}"
        assert process.terminate() == 0
        leaks = secrets.found_in(process.log_text())
        assert not leaks, f"{process.name} shows {leaks} on its way out"


def test_no_secret_in_any_output(
    system_s9: System,
    login_with_password: tuple[str, str],
    secured_kafka: SecuredKafka,
    recorder: Recorder,
) -> None:
    system = system_s9
    user, password = login_with_password
    secrets = Secrets(database_password=password, sasl_password=secured_kafka.password)
    admin = create_admin(
        secured_kafka.bootstrap,
        client_id="e2e-s9",
        extra=secured_kafka.sasl_config() | {"bootstrap.servers": secured_kafka.bootstrap},
    )
    ensure_topics(admin, [(t.name, t.partitions, t.config()) for t in CATALOGUE])
    with recorder.scenario(9, "secrets in DSN and SASL password never shown") as stats:
        # Reachable: work flows through all three processes.
        reachable = start_all(
            system,
            secured_kafka,
            with_password(system.identity_dsn, user, password),
            with_password(system.rewards_dsn, user, password),
            "up",
        )
        for process in reachable:
            process.wait_ready()
        agent, agency = uuid.uuid4(), uuid.uuid4()
        # The secured broker's membership topic is read from its start by this group.
        record_changes(system, [PlannedChange(agent, agency, True)])
        wait_until(
            projection_converged(system, [agent]),
            timeout=90,
            what="a change published and applied over SASL_SSL",
            alive=reachable,
        )
        stop_showing_nothing(reachable, secrets)
        stats.fault("database reachable: DEBUG logs, spans, /metrics, /readyz scanned")

        # Unreachable: the processes retry, report degraded, and still show no secret.
        nowhere = free_port()
        down = start_all(
            system,
            secured_kafka,
            with_password(system.identity_dsn, user, password, port=nowhere),
            with_password(system.rewards_dsn, user, password, port=nowhere),
            "down",
        )
        wait_until(
            lambda: all(not p.ready() and "component degraded" in p.log_text() for p in down),
            timeout=60,
            what="every process degraded, retrying the database",
            alive=down,
        )
        stop_showing_nothing(down, secrets)
        stats.fault("database unreachable: retry logs and degraded readiness scanned")
        stats.lost = 0
