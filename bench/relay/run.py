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

The relay's own process CPU per row (all its threads, librdkafka's included) is compared
with the plain producer's on the same rows. Target: at most 1.25x.

With `--baseline REV [REV ...]` the relay of each git revision REV (its `identity_fanout`
package, `pin_testkit.bench.checkout_package`, first on the relay's PYTHONPATH before this
checkout's other packages) drains the same rows too, alternating with this one in every
round: a change of the relay is judged against the code it replaces in the same run, not
against figures of another day. Every side drains rows written (untimed) into this
checkout's schema.

The same drain is then run by several relay instances sharing the lanes (`--relays`, 4 by
default, each holding its share before the rows commit), and the PostgreSQL CPU per row of
their backends compared with one relay's. Target: at most 1.15x (each relay reads only its
own lanes' rows, so more relays do not tax each other).

    uv run python bench/relay/run.py [--rows 50000] [--rounds 2] [--lanes 8] [--relays 1 4]
        [--baseline REV ...]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
import uuid
from collections.abc import Callable

import msgspec
import psycopg
from confluent_kafka import KafkaError, Message, Producer
from psycopg import sql
from rich.console import Console
from rich.table import Table

from identity_fanout.outbox.publisher import BATCH_SIZE_BYTES
from identity_fanout.outbox.relay import COMPRESSION
from identity_fanout.outbox.settings import RELAY_MESSAGE_MAX_BYTES
from identity_fanout.outbox.writer import OutboxMessage, outbox_message
from identity_fanout.schema import OUTBOX, migrate_database
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
    baseline_packages,
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

console = Console(width=max(120, Console().width))
"""Wide enough for the table when the output is a file or a pipe (`make bench | tee`)."""
PARTITIONS = 6
TARGET = 0.7
"""The relay's rate at least this share of the plain producer's, on the same records."""
CPU_TARGET = 1.25
"""The relay process's CPU per row at most this many times the plain producer's."""


PLAIN = "plain"
"""The side of the plain producer in the figures below; a relay side is named `side(n)`."""
SECONDS: dict[str, list[float]] = {}
"""Seconds of each send (PLAIN) and each drain (`side(n)`), per round."""
CLIENT_CPU: dict[str, list[float]] = {}
"""CPU seconds of the plain producer's process, or of every relay process together (all
their threads, librdkafka's included), during each send and each drain."""
BROKER_CPU: dict[str, list[float]] = {}
"""CPU seconds of the local Kafka broker during each send and each drain (none when the
broker runs elsewhere)."""
DATABASE_CPU: dict[str, list[float]] = {}
"""CPU seconds the relays' PostgreSQL backends used during each drain (read only where the
server runs on this machine: its backends' /proc entries; none otherwise)."""
SESSION_CPU: dict[tuple[str, str], list[float]] = {}
"""DATABASE_CPU split by the session it served: (side, LANES or DELETES)."""
LANES, DELETES = "the lanes' sessions (reads, backlog, locks)", "the deleters' sessions"
BUSY: dict[str, list[float]] = {}
"""Share of the machine's CPU busy (anyone's work) during each send and each drain."""
TAX_TARGET = 1.15
"""PostgreSQL CPU per published row with several relays at most this many times that of one
relay: relays sharing the lanes do not tax each other."""


def side(instances: int) -> str:
    return "relay" if instances == 1 else f"{instances} relays"


def baseline_side(revision: str) -> str:
    return f"relay @{revision}"


def backend_cpu(db: psycopg.Connection[tuple[object, ...]]) -> dict[int, tuple[str, float]]:
    """Per backend of this database other than `db`'s own (the relays'): which session it
    serves (DELETES: a deleter's, by its application_name; LANES: the lanes' session, which
    reads, counts the backlog and holds the locks) and its CPU seconds so far."""
    rows = db.execute(
        "SELECT pid, application_name FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid()"
    ).fetchall()
    cpu: dict[int, tuple[str, float]] = {}
    for pid, name in rows:
        try:
            kind = DELETES if "-delete@" in str(name) else LANES
            cpu[int(str(pid))] = (kind, cpu_seconds(int(str(pid))))
        except OSError:  # gone, or the server runs elsewhere
            continue
    return cpu


def spent_by_session(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    spent = dict.fromkeys((LANES, DELETES), 0.0)
    for pid, (kind, seconds) in after.items():
        spent[kind] += seconds - before.get(pid, (kind, 0.0))[1]
    return spent


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
        BUSY.setdefault(self._side, []).append(busy_share(self._machine, machine_jiffies()))
        if self._broker:
            spent = cpu_seconds(self._broker) - self._broker_cpu
            BROKER_CPU.setdefault(self._side, []).append(spent)


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
    broker = Accounting(bootstrap, PLAIN)
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
    CLIENT_CPU.setdefault(PLAIN, []).append(time.process_time() - cpu_before)
    SECONDS.setdefault(PLAIN, []).append(took)
    broker.done()
    if remaining or failed:
        raise RuntimeError(f"plain producer: {remaining} unsent, {len(failed)} failed")
    return took


def relay_drain(
    dsn: str,
    bootstrap: str,
    topic: Topic,
    batch: list[OutboxMessage],
    lanes: int,
    *,
    instances: int = 1,
    name: str | None = None,
    pythonpath: str | None = None,
) -> float:
    """Seconds from the commit of `batch` to the relays deleting its last row, with
    `instances` relay processes sharing the lanes (each ready and holding its share)."""
    relays = [
        ServiceProcess(
            name=f"relay-{n}",
            program="identity-fanout",
            args=("relay",),
            env=service_environment(
                IDENTITY_FANOUT_DATABASE_DSN=dsn,
                IDENTITY_FANOUT_KAFKA_BOOTSTRAP=bootstrap,
                IDENTITY_FANOUT_METRICS_PORT=str(port),
                IDENTITY_FANOUT_LOG_LEVEL="WARNING",
                IDENTITY_FANOUT_OUTBOX_LANES=str(lanes),
                **({} if pythonpath is None else {"PYTHONPATH": pythonpath}),
            ),
            metrics_port=port,
        )
        for n, port in enumerate(free_port() for _ in range(instances))
    ]
    label = name or side(instances)
    share = -(-lanes // instances)  # each relay holds at most ceil(lanes / instances)

    def lanes_shared() -> bool:
        held = [r.metric("identity_outbox_lanes_held") for r in relays]
        return sum(held) == lanes and max(held) <= share

    with contextlib.ExitStack() as stack, psycopg.connect(dsn, autocommit=True) as db:
        for relay in relays:
            stack.enter_context(relay.start())
        for relay in relays:
            relay.wait_ready(60)
        wait_until(lanes_shared, 60, "the lanes shared by the relays", alive=relays)
        with db.transaction():
            OUTBOX.write(db, laid_out_as_pages(db, batch))
        started = time.monotonic()
        cpu_before = sum(cpu_seconds(r.pid) for r in relays)
        database_before = backend_cpu(db)
        broker = Accounting(bootstrap, label)
        # Watched on their metrics (`identity_outbox_published_total`, counted after each
        # DELETE) every 50 ms: a count(*) every few ms would load the database the relays
        # read from, and scraping them more often would take the relays' own CPU.
        wait_until(
            lambda: sum(r.metric("identity_outbox_published_total") for r in relays) >= len(batch),
            300,
            "the batch published",
            alive=relays,
        )
        took = time.monotonic() - started
        spent = sum(cpu_seconds(r.pid) for r in relays) - cpu_before
        CLIENT_CPU.setdefault(label, []).append(spent)
        SECONDS.setdefault(label, []).append(took)
        broker.done()
        database_after = backend_cpu(db)
        if database_after:
            sessions = spent_by_session(database_before, database_after)
            DATABASE_CPU.setdefault(label, []).append(sum(sessions.values()))
            for kind, seconds in sessions.items():
                SESSION_CPU.setdefault((label, kind), []).append(seconds)
        if OUTBOX.rows_by_topic(db):
            raise RuntimeError("the relays reported more rows than they deleted")
        return took


PAGE_USERS = 500
"""The fan-out worker's page (IDENTITY_FANOUT_BATCH_SIZE's default): the rows a role change
writes come in pages of this many users, each page's rows clustered by lane."""


def laid_out_as_pages(
    db: psycopg.Connection[tuple[object, ...]], batch: list[OutboxMessage]
) -> list[OutboxMessage]:
    """`batch` in the order the fan-out's pages write such rows: page by page, each page's
    rows by key slot (the database's slot function), so the outbox's heap holds them as a
    role change leaves it."""
    slots = [
        int(str(slot))
        for (slot,) in db.execute(
            sql.SQL(
                "SELECT {}(k) FROM unnest(%s::text[]) WITH ORDINALITY AS t (k, n) ORDER BY n"
            ).format(sql.Identifier(OUTBOX.tables.schema, OUTBOX.tables.key_slot_function)),
            ([m.key for m in batch],),
        )
    ]
    ordered: list[OutboxMessage] = []
    for start in range(0, len(batch), PAGE_USERS):
        page = range(start, min(start + PAGE_USERS, len(batch)))
        ordered.extend(batch[i] for i in sorted(page, key=lambda i: (slots[i], batch[i].key)))
    return ordered


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--lanes", type=int, default=8)
    parser.add_argument(
        "--relays",
        type=int,
        nargs="+",
        default=[1, 4],
        help="relay instances sharing the lanes in each round (1 is always measured)",
    )
    parser.add_argument(
        "--baseline",
        metavar="REV",
        nargs="*",
        default=[],
        help="also drain with the relay of each of these git revisions, alternating",
    )
    args = parser.parse_args()
    counts = sorted({1, *args.relays})

    services = environment_or_local()
    admin_dsn, bootstrap = services.postgres_dsn, services.kafka_bootstrap
    topics = TopicFactory(bootstrap, prefix="pin-bench-relay")
    with (
        temporary_database(admin_dsn, "pin_bench_relay") as dsn,
        baseline_packages(args.baseline) as baselines,
    ):
        try:
            migrate_database(dsn)
            with console.status(f"building {args.rows:,} access events"):
                template = create_topic(topics)
                batch = messages(template, args.rows, uuid.uuid4())
            size = sum(len(m.value) for m in batch) / len(batch)
            for round_ in range(args.rounds):
                with console.status(f"round {round_ + 1}: plain producer"):
                    plain_producer(bootstrap, create_topic(topics), batch)
                # Every relay side in turn, each round starting one further: none always
                # drains right after the same other (whose deletes autovacuum cleans up).
                drains: list[tuple[str, str | None, int]] = [
                    (baseline_side(rev), package, 1) for rev, package in baselines.items()
                ]
                drains += [(side(n), None, n) for n in counts]
                turn = round_ % len(drains)
                for name, package, instances in drains[turn:] + drains[:turn]:
                    with console.status(f"round {round_ + 1}: {name}"):
                        topic = create_topic(topics)
                        moved = [msg_for(m, topic) for m in batch]
                        relay_drain(
                            dsn,
                            bootstrap,
                            topic,
                            moved,
                            args.lanes,
                            instances=instances,
                            name=name,
                            pythonpath=package,
                        )
        finally:
            topics.delete_all()
    report(args.rows, size, args.lanes, counts, args.baseline)


def msg_for(message: OutboxMessage, topic: Topic) -> OutboxMessage:
    """The same record for another topic (each measurement writes to a fresh topic)."""
    return msgspec.structs.replace(message, topic=topic.name)


def report(rows: int, size: float, lanes: int, counts: list[int], baselines: list[str]) -> None:
    relays = [*map(side, counts)]
    sides = [PLAIN, side(1), *map(baseline_side, baselines), *relays[1:]]
    table = Table(
        title=f"identity-fanout relay: drain {rows:,} outbox rows (~{size:.0f} B each, "
        f"acks=all, idempotent, {COMPRESSION}; {lanes} lanes; "
        f"{os.cpu_count()} cores shared with PostgreSQL and Kafka)",
        title_justify="left",
    )
    table.add_column("measure (per 100,000 rows: CPU-s)")
    for name in sides:
        table.add_column(name, justify="right")
    table.add_column("target", justify="right")
    rate = {name: rows / min(SECONDS[name]) for name in sides}
    ceiling = cpu_ceiling()

    def rounds(figures: dict[str, list[float]], shown: Callable[[float], str]) -> list[str]:
        return [", ".join(map(shown, figures.get(name, []))) or "-" for name in sides]

    def per_row(t: float) -> str:
        return f"{t * 100_000 / rows:.2f}"

    table.add_row("seconds (rounds)", *rounds(SECONDS, lambda t: f"{t:.2f}"), "")
    table.add_row("best rows/s", *(f"{rate[name]:,.0f}" for name in sides), "")
    table.add_row(
        "ratio to the plain producer",
        *(f"{rate[name] / rate[PLAIN]:.2f}" for name in sides),
        f">= {TARGET:.2f} (1 relay)",
    )
    if ceiling is not None:
        table.add_row(
            "  CPU-bound ceiling of the ratio here",
            *["", f"{ceiling:.2f}"],
            *[""] * (len(sides) - 2),
            "",
        )
    table.add_row("producing process(es)", *rounds(CLIENT_CPU, per_row), "")
    cpu = {name: statistics.median(CLIENT_CPU[name]) for name in sides if CLIENT_CPU.get(name)}
    table.add_row(
        "  relay process CPU per row vs the plain producer",
        "1.00",
        *(f"{cpu[name] / cpu[PLAIN]:.2f}x" if name in cpu else "-" for name in sides[1:]),
        f"<= {CPU_TARGET:.2f}x (1 relay)",
    )
    table.add_row("Kafka broker", *rounds(BROKER_CPU, per_row), "")
    table.add_row("the relays' PostgreSQL backends", *rounds(DATABASE_CPU, per_row), "")
    for kind in (LANES, DELETES):
        by_side = {name: SESSION_CPU.get((name, kind), []) for name in sides}
        table.add_row(f"  of which {kind}", *rounds(by_side, per_row), "")
    taxes = {n: tax(n) for n in counts if n > 1}
    table.add_row(
        "  PostgreSQL per row vs 1 relay",
        *["", "1.00"],
        *[""] * len(baselines),
        *(f"{taxes[n]:.2f}x" if taxes[n] is not None else "-" for n in counts[1:]),
        f"<= {TAX_TARGET:.2f}x",
    )
    table.add_row("machine busy", *rounds(BUSY, lambda b: f"{b:.0%}"), "")
    console.print(table)
    record(
        Comparison.rate(
            f"2. relay drain, {rows:,} outbox rows, one instance, {lanes} lanes",
            Figure("relay (commit -> last row deleted)", rate[side(1)]),
            Figure("plain confluent-kafka producer", rate[PLAIN]),
            unit="rows/s",
            target=TARGET,
            note=f"best of {len(SECONDS[PLAIN])} rounds each"
            + ("" if ceiling is None else f"; CPU-bound ceiling here {ceiling:.2f}"),
        )
    )
    record(
        Comparison.duration(
            f"2. relay process CPU-s per 100,000 rows, one instance, {lanes} lanes",
            Figure("relay", cpu[side(1)] * 100_000 / rows),
            Figure("plain confluent-kafka producer", cpu[PLAIN] * 100_000 / rows),
            target=CPU_TARGET,
            note=f"median of {len(CLIENT_CPU[PLAIN])} rounds each",
        )
    )
    for instances in counts[1:]:
        if DATABASE_CPU.get(side(instances)) and DATABASE_CPU.get(side(1)):
            record(
                Comparison.duration(
                    f"2. relays do not tax each other: PostgreSQL CPU-s per 100,000 rows, "
                    f"{instances} relays vs 1",
                    Figure(side(instances), median_per_row(side(instances), rows)),
                    Figure(side(1), median_per_row(side(1), rows)),
                    target=TAX_TARGET,
                    note=f"median of {len(DATABASE_CPU[side(1)])} rounds each",
                )
            )


def median_per_row(name: str, rows: int) -> float:
    return statistics.median(DATABASE_CPU[name]) * 100_000 / rows


def tax(instances: int) -> float | None:
    """PostgreSQL CPU per row with `instances` relays over that of one (medians)."""
    if not (DATABASE_CPU.get(side(instances)) and DATABASE_CPU.get(side(1))):
        return None
    return statistics.median(DATABASE_CPU[side(instances)]) / statistics.median(
        DATABASE_CPU[side(1)]
    )


def cpu_ceiling() -> float | None:
    """The highest relay/plain ratio a relay costing the plain producer's client CPU per row
    could reach while both sides keep the cores busy (medians of the rounds); None without
    the broker's or PostgreSQL's figures."""
    one = side(1)
    if not (BROKER_CPU.get(PLAIN) and BROKER_CPU.get(one) and DATABASE_CPU.get(one)):
        return None
    client = statistics.median(CLIENT_CPU[PLAIN])
    plain = client + statistics.median(BROKER_CPU[PLAIN])
    relay = client + statistics.median(BROKER_CPU[one]) + statistics.median(DATABASE_CPU[one])
    return plain / relay


if __name__ == "__main__":
    main()
