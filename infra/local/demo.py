"""`make demo`: the system on this machine, shown to a person.

Brings PostgreSQL and Kafka up (or reuses them) and prints what runs where, checked live:
the servers' versions, the databases and the topics of the contract catalogue.
"""

from __future__ import annotations

import psycopg
from rich.console import Console
from rich.table import Table

from pin_contracts.topics import CATALOGUE, REWARDS_MEMBERSHIP_CONSUMER_GROUP
from pin_runtime.kafka import create_admin
from pin_testkit.local import ensure_up


def main() -> None:
    console = Console()
    with console.status("starting PostgreSQL and Kafka (first run fetches Kafka from Maven)"):
        services = ensure_up()

    with psycopg.connect(services.postgres_dsn) as conn:
        version = conn.execute("SHOW server_version").fetchone()
        databases = [
            name
            for (name,) in conn.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE 'pin\\_%' ORDER BY 1"
            )
        ]
    metadata = create_admin(services.kafka_bootstrap, client_id="pin-demo").list_topics(timeout=10)

    servers = Table(title="Infrastructure", title_justify="left")
    servers.add_column("service")
    servers.add_column("address")
    servers.add_column("state")
    servers.add_row(
        "PostgreSQL",
        services.postgres_dsn,
        f"{version[0] if version else '?'}; databases: {', '.join(databases)}",
    )
    servers.add_row(
        "Apache Kafka (KRaft)",
        services.kafka_bootstrap,
        f"{len(metadata.brokers)} broker(s), cluster {metadata.cluster_id}",
    )
    console.print(servers)

    topics = Table(title="Topic catalogue (pin-contracts)", title_justify="left")
    topics.add_column("topic")
    topics.add_column("key")
    topics.add_column("partitions (want / have)", justify="right")
    for topic in CATALOGUE:
        have = metadata.topics.get(topic.name)
        topics.add_row(
            topic.name,
            topic.key_field,
            f"{topic.partitions} / {len(have.partitions) if have else 'missing'}",
        )
    console.print(topics)
    console.print(f"consumer group of the membership consumer: {REWARDS_MEMBERSHIP_CONSUMER_GROUP}")
    console.print(
        "\n[bold]Use them:[/bold]\n"
        f"  export PIN_POSTGRES_DSN='{services.postgres_dsn}'\n"
        f"  export PIN_KAFKA_BOOTSTRAP='{services.kafka_bootstrap}'\n"
        "  make down   # stops both"
    )


if __name__ == "__main__":
    main()
