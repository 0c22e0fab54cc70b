"""`make demo`: the system on this machine, shown to a person.

Brings PostgreSQL and Kafka up (or reuses them), shows what runs where, migrates both
databases, starts the services as their own processes (`identity-fanout worker`,
`identity-fanout relay`, `rewards-membership consume`), fans a 20,000-user role change out
to Kafka, records agent membership changes in identity and follows them into the rewards
projection, sends a malformed record to the DLQ, and stops what it started.
"""

from __future__ import annotations

import psycopg
from demo_fanout import fan_out
from demo_membership import memberships
from demo_support import Service, console
from rich.table import Table

from identity_fanout.schema import migrate_database
from pin_contracts.topics import CATALOGUE
from pin_runtime.kafka import create_admin
from pin_testkit.local import LocalServices, down, ensure_up, status
from pin_testkit.runtime_roles import runtime_dsn
from pin_testkit.service import run_cli, service_environment


def show_infrastructure(services: LocalServices) -> None:
    with psycopg.connect(services.postgres_dsn) as conn:
        version = conn.execute("SHOW server_version").fetchone()
    metadata = create_admin(services.kafka_bootstrap, client_id="pin-demo").list_topics(timeout=10)
    servers = Table(title="Infrastructure", title_justify="left")
    for column in ("service", "address", "state"):
        servers.add_column(column)
    servers.add_row(
        "PostgreSQL",
        services.postgres_dsn,
        f"{version[0] if version else '?'}; databases pin_identity, pin_rewards",
    )
    servers.add_row(
        "Apache Kafka (KRaft)",
        services.kafka_bootstrap,
        f"{len(metadata.brokers)} broker(s); topics: "
        + ", ".join(
            f"{t.name} ({len(metadata.topics[t.name].partitions)})"
            for t in CATALOGUE
            if t.name in metadata.topics
        ),
    )
    console.print(servers)


def main() -> None:
    # PostgreSQL and Kafka already running (`make up`, tests) are reused and left running;
    # what the demo had to start itself, it stops again at the end.
    already_up = status().up
    with console.status("starting PostgreSQL and Kafka (first run fetches Kafka from Maven)"):
        services = ensure_up()
    try:
        run(services)
    finally:
        if not already_up:
            with console.status("stopping PostgreSQL and Kafka"):
                down()
            console.print("stopped PostgreSQL and Kafka (`make up` keeps them running)")
    if already_up:
        console.print(
            "\n[bold]PostgreSQL and Kafka keep running[/bold] (they were up before the demo):\n"
            f"  export PIN_POSTGRES_DSN='{services.postgres_dsn}'\n"
            f"  export PIN_KAFKA_BOOTSTRAP='{services.kafka_bootstrap}'\n"
            "  make down   # stops both"
        )


def run(services: LocalServices) -> None:
    show_infrastructure(services)
    bootstrap = {
        "IDENTITY_FANOUT_KAFKA_BOOTSTRAP": services.kafka_bootstrap,
        "REWARDS_MEMBERSHIP_KAFKA_BOOTSTRAP": services.kafka_bootstrap,
    }

    def identity(*groups: str) -> dict[str, str]:
        """Settings of an identity-fanout process logging in as a runtime role's user."""
        dsn = runtime_dsn(services.identity_dsn, *groups)
        return bootstrap | {"IDENTITY_FANOUT_DATABASE_DSN": dsn}

    def rewards(*groups: str) -> dict[str, str]:
        dsn = runtime_dsn(services.rewards_dsn, *groups)
        return bootstrap | {"REWARDS_MEMBERSHIP_DATABASE_DSN": dsn}

    # Migrations as the owner (pin-local's superuser); they create the runtime roles.
    migrate_database(services.identity_dsn)
    run_cli(
        "rewards-membership",
        ["migrate"],
        service_environment(REWARDS_MEMBERSHIP_DATABASE_DSN=services.rewards_dsn),
    )
    # As the chart deploys them, each as its runtime role: the fan-out worker, the outbox
    # relay, the membership consumer; the operator's commands as the operator's role.
    worker = Service(
        "identity-fanout",
        ["worker", "--no-relay"],
        identity("identity_fanout_worker"),
        tool_env=lambda args: identity(
            "identity_membership_producer"
            if "memberships" in args[:1]
            else "identity_fanout_operator"
        ),
    )
    relay = Service("identity-fanout", ["relay"], identity("identity_fanout_relay"))
    consumer = Service(
        "rewards-membership",
        ["consume"],
        rewards("rewards_membership_consumer"),
        tool_env=lambda _args: rewards("rewards_membership_operator"),
    )
    try:
        fan_out(worker, services.identity_dsn, services.kafka_bootstrap)
        memberships(
            worker, consumer, services.identity_dsn, services.rewards_dsn, services.kafka_bootstrap
        )
    finally:
        consumer.stop()
        relay.stop()
        worker.stop()


if __name__ == "__main__":
    main()
