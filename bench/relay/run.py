"""Benchmark: one outbox relay draining N rows against a plain producer sending the same.

Both send the same records (the outbox rows' keys, values and headers: access events of a
role change) to topics of the same shape with the same producer settings (acks=all,
idempotent, zstd, the relay's linger, batch.size and message.max.bytes), in the same run:

- plain: a confluent-kafka producer fed from memory, produce everything, flush;
- relay: `identity-fanout relay` as its own process (the chart's topology), idle and ready;
  the clock starts when the N rows commit (one COPY) and stops when it has deleted the last
  one (it deletes a row only after the broker acknowledged it).

Each is measured `--rounds` times, alternating; the best of each is compared. Target: the
relay at least 70% of the plain producer's rate.

Both runs keep this machine's cores busy, so the ratio is also bounded by CPU: beside the
rates the script prints each side's CPU per row (the client, the broker, the relay's
PostgreSQL backends) and the machine's busy share, and from them the highest ratio any relay
could reach here if its own process cost no more than the plain producer: the plain side's
CPU per row (client + broker) over the relay side's with the client's part replaced by the
plain producer's (plain client + relay's broker + PostgreSQL).

    uv run python bench/relay/run.py [--rows 50000] [--rounds 2] [--lanes 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid

import msgspec
import psycopg
from confluent_kafka import KafkaError, Message, Producer
from rich.console import Console
from rich.table import Table

from identity_fanout.outbox.publisher import BATCH_SIZE_BYTES
from identity_fanout.outbox.relay import COMPRESSION
from identity_fanout.outbox.writer import OutboxMessage, outbox_message
from identity_fanout.schema import OUTBOX, migrate_database
from identity_fanout.settings import RELAY_MESSAGE_MAX_BYTES
from pin_contracts import (
    AccessChangeReason,
    ActiveRoleAssignmentSnapshot,
    Topic,
    UserAccessChangedKafkaEvent,
    envelope_for,
)
from pin_contracts.enums import ScopeType
from pin_contracts.topics import USER_ACCESS_CHANGED
from pin_runtime.kafka import producer_config
from pin_testkit.bench import (
    Comparison,
    Figure,
    busy_share,
    cpu_seconds,
    listener_pid,
    machine_jiffies,
    record,
)
from pin_testkit.databases import temporary_database
from pin_testkit.discovery import environment_or_local
from pin_testkit.ports import free_port
from pin_testkit.service import ServiceProcess, service_environment
from pin_testkit.topics import TopicFactory
from pin_testkit.waiting import wait_until

console = Console()
PARTITIONS = 6
TARGET = 0.7
"""The relay's rate at least this share of the plain producer's, on the same records."""


RELAY_CPU: list[float] = []
"""CPU seconds the relay process used during each drain (all its threads)."""
PLAIN_CPU: list[float] = []
"""CPU seconds the plain producer (this process, every thread) used for each send."""
BROKER_CPU: dict[str, list[float]] = {"plain": [], "relay": []}
"""CPU seconds of the local Kafka broker during each send and each drain (empty when the
broker runs elsewhere)."""
BUSY: dict[str, list[float]] = {"plain": [], "relay": []}
"""Share of the machine's CPU busy (anyone's work) during each send and each drain."""
DATABASE_CPU: list[float] = []
"""CPU seconds the relay's PostgreSQL backends used during each drain (read only where the
server runs on this machine: its backends' /proc entries; empty otherwise)."""


def backend_cpu(db: psycopg.Connection[tuple[object, ...]]) -> dict[int, float]:
    """CPU seconds per backend of this database other than `db`'s own (the relay's)."""
    rows = db.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid()"
    ).fetchall()
    cpu: dict[int, float] = {}
    for (pid,) in rows:
        try:
            cpu[int(str(pid))] = cpu_seconds(int(str(pid)))
        except OSError:  # gone, or the server runs elsewhere
            continue
    return cpu


def create_topic(topics: TopicFactory) -> Topic:
    name = topics.create(partitions=PARTITIONS, config=USER_ACCESS_CHANGED.config())
    return Topic(
        name=name,
        partitions=PARTITIONS,
        key_field=USER_ACCESS_CHANGED.key_field,
        event_type=USER_ACCESS_CHANGED.event_type,
        contract_version=USER_ACCESS_CHANGED.contract_version,
    )


def messages(topic: Topic, rows: int, role: uuid.UUID) -> list[OutboxMessage]:
    """What a role change writes: one access event per user, a few assignments each."""
    out = []
    for _ in range(rows):
        user = uuid.uuid4()
        assignments = tuple(
            ActiveRoleAssignmentSnapshot(
                assignment_id=uuid.uuid4(),
                role_id=role if i == 0 else uuid.uuid4(),
                role_code=f"role-{i}",
                scope_type=ScopeType.ORGANIZATION.value,
                scope_organization_id=uuid.uuid4(),
            )
            for i in range(3)
        )
        event = UserAccessChangedKafkaEvent(
            user_id=user,
            company_id=role,
            change_reason=AccessChangeReason.ROLE_PERMISSIONS_CHANGED.value,
            active_assignments=assignments,
            version=1,
        )
        out.append(outbox_message(envelope_for(event, correlation_id="bench"), topic))
    return out


class Accounting:
    """The broker's CPU and the machine's busy share from now to `done()`, kept for `side`."""

    def __init__(self, bootstrap: str, side: str) -> None:
        self._side = side
        self._broker = listener_pid(int(bootstrap.split(",", maxsplit=1)[0].rsplit(":", 1)[1]))
        self._broker_cpu = cpu_seconds(self._broker) if self._broker else 0.0
        self._machine = machine_jiffies()

    def done(self) -> None:
        BUSY[self._side].append(busy_share(self._machine, machine_jiffies()))
        if self._broker:
            BROKER_CPU[self._side].append(cpu_seconds(self._broker) - self._broker_cpu)


def plain_producer(bootstrap: str, topic: Topic, batch: list[OutboxMessage]) -> float:
    """Seconds for a plain producer to send `batch` and have every record acknowledged."""
    config = producer_config(
        bootstrap,
        client_id="bench-plain",
        compression=COMPRESSION,
        extra={"message.max.bytes": RELAY_MESSAGE_MAX_BYTES, "batch.size": BATCH_SIZE_BYTES},
    )
    producer = Producer(config)
    records: list[tuple[bytes, bytes, list[tuple[str, str | bytes | None]]]] = [
        (m.key.encode(), m.value, [(n, v.encode()) for n, v in m.headers]) for m in batch
    ]
    failed: list[KafkaError] = []

    def on_delivery(error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            failed.append(error)

    producer.list_topics(topic.name, timeout=10)  # connected and warm, like the idle relay
    broker = Accounting(bootstrap, "plain")
    started, cpu_before = time.monotonic(), time.process_time()
    for key, value, headers in records:
        while True:
            try:
                producer.produce(
                    topic.name, key=key, value=value, headers=headers, on_delivery=on_delivery
                )
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    remaining = producer.flush(120)
    took = time.monotonic() - started
    PLAIN_CPU.append(time.process_time() - cpu_before)
    broker.done()
    if remaining or failed:
        raise RuntimeError(f"plain producer: {remaining} unsent, {len(failed)} failed")
    return took


def relay_drain(
    dsn: str, bootstrap: str, topic: Topic, batch: list[OutboxMessage], lanes: int
) -> float:
    """Seconds from the commit of `batch` to the relay deleting its last row."""
    port = free_port()
    relay = ServiceProcess(
        name="relay",
        program="identity-fanout",
        args=("relay",),
        env=service_environment(
            IDENTITY_FANOUT_DATABASE_DSN=dsn,
            IDENTITY_FANOUT_KAFKA_BOOTSTRAP=bootstrap,
            IDENTITY_FANOUT_METRICS_PORT=str(port),
            IDENTITY_FANOUT_LOG_LEVEL="WARNING",
            IDENTITY_FANOUT_OUTBOX_LANES=str(lanes),
        ),
        metrics_port=port,
    )
    with relay.start(), psycopg.connect(dsn, autocommit=True) as db:
        relay.wait_ready(60)
        time.sleep(1.0)  # its first look at the lanes (they are free: it takes them all)
        with db.transaction():
            OUTBOX.write(db, batch)
        started, cpu_before = time.monotonic(), cpu_seconds(relay.pid)
        database_before = backend_cpu(db)
        broker = Accounting(bootstrap, "relay")
        # Watched on its metrics (`identity_outbox_published_total`, counted after each
        # DELETE) every 50 ms: a count(*) every few ms would load the database the relay
        # reads from, and scraping it more often would take the relay's own CPU.
        wait_until(
            lambda: relay.metric("identity_outbox_published_total") >= len(batch),
            300,
            "the batch published",
            alive=[relay],
        )
        took = time.monotonic() - started
        RELAY_CPU.append(cpu_seconds(relay.pid) - cpu_before)
        broker.done()
        database_after = backend_cpu(db)
        if database_after:
            DATABASE_CPU.append(
                sum(t - database_before.get(pid, 0.0) for pid, t in database_after.items())
            )
        if db.execute("SELECT count(*) FROM identity.outbox").fetchone() != (0,):
            raise RuntimeError("the relay reported more rows than it deleted")
        return took


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--lanes", type=int, default=8)
    args = parser.parse_args()

    services = environment_or_local()
    admin_dsn, bootstrap = services.postgres_dsn, services.kafka_bootstrap
    topics = TopicFactory(bootstrap, prefix="pin-bench-relay")
    plain: list[float] = []
    relay: list[float] = []
    with temporary_database(admin_dsn, "pin_bench_relay") as dsn:
        try:
            migrate_database(dsn)
            with console.status(f"building {args.rows:,} access events"):
                template = create_topic(topics)
                batch = messages(template, args.rows, uuid.uuid4())
            size = sum(len(m.value) for m in batch) / len(batch)
            for round_ in range(args.rounds):
                with console.status(f"round {round_ + 1}: plain producer"):
                    topic = create_topic(topics)
                    plain.append(plain_producer(bootstrap, topic, batch))
                with console.status(f"round {round_ + 1}: relay"):
                    topic = create_topic(topics)
                    moved = [msg_for(m, topic) for m in batch]
                    relay.append(relay_drain(dsn, bootstrap, topic, moved, args.lanes))
        finally:
            topics.delete_all()
    report(args.rows, size, args.lanes, plain, relay)


def msg_for(message: OutboxMessage, topic: Topic) -> OutboxMessage:
    """The same record for another topic (each measurement writes to a fresh topic)."""
    return msgspec.structs.replace(message, topic=topic.name)


def report(rows: int, size: float, lanes: int, plain: list[float], relay: list[float]) -> None:
    table = Table(
        title=f"identity-fanout relay: drain {rows:,} outbox rows (~{size:.0f} B each, "
        f"acks=all, idempotent, {COMPRESSION}; {lanes} lanes, one instance; "
        f"{os.cpu_count()} cores shared with PostgreSQL and Kafka)",
        title_justify="left",
    )
    for column in ("measure", "seconds (rounds)", "best rows/s", "ratio", "target"):
        table.add_column(column, justify="left" if column == "measure" else "right")
    plain_rate, relay_rate = rows / min(plain), rows / min(relay)
    table.add_row(
        "plain confluent-kafka producer",
        ", ".join(f"{t:.2f}" for t in plain),
        f"{plain_rate:,.0f}",
        "1.00",
        "",
    )
    table.add_row(
        "relay (commit -> last row deleted)",
        ", ".join(f"{t:.2f}" for t in relay),
        f"{relay_rate:,.0f}",
        f"{relay_rate / plain_rate:.2f}",
        f">= {TARGET:.2f}",
    )
    table.add_row(
        "relay process CPU during the drain",
        ", ".join(f"{t:.2f}" for t in RELAY_CPU),
        "",
        "",
        "",
    )
    for label, seconds in (
        ("plain producer CPU-s per 100,000 rows", PLAIN_CPU),
        ("broker CPU-s per 100,000 rows, plain", BROKER_CPU["plain"]),
        ("relay CPU-s per 100,000 rows", RELAY_CPU),
        ("its PostgreSQL backends' CPU-s per 100,000 rows", DATABASE_CPU),
        ("broker CPU-s per 100,000 rows, relay", BROKER_CPU["relay"]),
    ):
        if seconds:
            per_row = ", ".join(f"{t * 100_000 / rows:.2f}" for t in seconds)
            table.add_row(label, per_row, "", "", "")
    for side in ("plain", "relay"):
        busy = ", ".join(f"{b:.0%}" for b in BUSY[side])
        table.add_row(f"machine busy during the {side} runs", busy, "", "", "")
    ceiling = cpu_ceiling()
    if ceiling is not None:
        table.add_row("CPU-bound ceiling of the ratio on these cores", "", "", f"{ceiling:.2f}", "")
    console.print(table)
    record(
        Comparison.rate(
            f"2. relay drain, {rows:,} outbox rows, one instance, {lanes} lanes",
            Figure("relay (commit -> last row deleted)", relay_rate),
            Figure("plain confluent-kafka producer", plain_rate),
            unit="rows/s",
            target=TARGET,
            note=f"best of {len(relay)} rounds each"
            + ("" if ceiling is None else f"; CPU-bound ceiling here {ceiling:.2f}"),
        )
    )


def cpu_ceiling() -> float | None:
    """The highest relay/plain ratio a relay costing the plain producer's client CPU per row
    could reach while both sides keep the cores busy (medians of the rounds); None without
    the broker's or PostgreSQL's figures."""
    if not (BROKER_CPU["plain"] and BROKER_CPU["relay"] and DATABASE_CPU):
        return None
    client = statistics.median(PLAIN_CPU)
    plain = client + statistics.median(BROKER_CPU["plain"])
    relay = client + statistics.median(BROKER_CPU["relay"]) + statistics.median(DATABASE_CPU)
    return plain / relay


if __name__ == "__main__":
    main()
