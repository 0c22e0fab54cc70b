"""Benchmark 4: the rewards-membership consumer against its two limits, in one run.

On the same workload (N membership events, about 100,000 agents over 1,000 agencies, 5%
duplicate deliveries, 5% stale reorders), each in a process of its own:

(a) the real consumer (`MembershipConsumer.poll_once` as deployed: runtime role, DLQ
    producer, LOG_LEVEL=WARNING) draining the topic;
(b) a plain confluent-kafka consumer, same client settings, that polls the same records and
    msgspec-decodes each value with the contract's decoder (no database);
(c) the database's floor: the same records read in batches of the same size and decided in
    memory beforehand (untimed), then, timed, per batch one transaction of set-based
    statements writing the batch's rows (one upsert) and inbox keys (one insert), no Kafka.

Prints one table (msgs/s, ratios) and records two comparisons (`pin_testkit.bench`).

With `--baseline REV [REV ...]` the consumer of each git revision REV (its
`rewards_membership` package, `pin_testkit.bench.checkout_package`, first on the consumer's
PYTHONPATH) drains the same records too, each on a database of its own, in turn with this
checkout's in every round (`--rounds`): a change of the consumer is judged against the code
it replaces in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import msgspec
import psycopg
from confluent_kafka import Consumer
from psycopg import sql
from rich.console import Console
from rich.table import Table

from pin_contracts import (
    decode_membership_changed,
    encode,
    envelope_for,
    headers_for,
    kafka_key,
)
from pin_runtime.composition import collect_less
from pin_runtime.kafka import create_admin, create_consumer, create_producer, ensure_topics
from pin_runtime.logging import configure_logging
from pin_runtime.settings import Secret
from pin_runtime.sql import assignments, columns
from pin_testkit.bench import Comparison, Figure, checkout_package, record
from pin_testkit.events import membership_event
from pin_testkit.runtime_roles import ensure_login, runtime_dsn
from rewards_membership.app import build_consumer, run_migrations
from rewards_membership.batch_sql import ROW_KEY
from rewards_membership.metrics import Metrics
from rewards_membership.rules.guard import MembershipRow
from rewards_membership.rules.plan import RowKey, plan_batch
from rewards_membership.rules.validation import validate
from rewards_membership.settings import Settings

T0 = datetime(2025, 1, 1, tzinfo=UTC)
DUPLICATE_SHARE = 0.05
STALE_SHARE = 0.05
STALE_BY = 2  # a stale reorder re-sends the version two below the row's latest
RECENT = 20_000  # duplicates are drawn from the last records sent
BENCHMARK = "4. membership consumer"
SOURCE: Final = "services/rewards-membership/src"
"""Where the consumer's package is in the repository: what a baseline replaces."""
THIS: Final = "this checkout"

Record = tuple[bytes, bytes, list[tuple[str, str | bytes | None]]]

# The floor's row document: MembershipRow's fields, in order, with their column types
# (json_to_recordset's column definition), so the floor writes exactly the consumer's columns.
FLOOR_ROW_DOCUMENT: Final = sql.SQL(
    "agent_user_id uuid, company_id uuid, membership_status text, leave_reason text,"
    " left_at timestamptz, effective_at timestamptz, first_activity_at timestamptz,"
    " last_activity_at timestamptz, last_membership_version bigint, version bigint"
)
# The floor's one statement for a batch's rows: a plain upsert of their final state (no row
# lock, no version guard, no inbox lookup), the rows as ONE JSON document of MembershipRows.
FLOOR_UPSERT: Final = sql.SQL(
    "INSERT INTO rewards.agent_performance ({columns})"
    " SELECT * FROM json_to_recordset(%(rows)s::json) AS r ({row_document})"
    " ON CONFLICT ({key}) DO UPDATE SET {assignments}, updated_at = now()"
).format(
    columns=columns(MembershipRow),
    row_document=FLOOR_ROW_DOCUMENT,
    key=sql.SQL(", ").join(map(sql.Identifier, ROW_KEY)),
    assignments=assignments(MembershipRow, "excluded", keep=ROW_KEY),
)
# And one for its inbox marks: `[[key, outcome], ...]`.
FLOOR_INBOX: Final = sql.SQL(
    "INSERT INTO rewards.inbox (idempotency_key, outcome)"
    " SELECT m->>0, m->>1 FROM json_array_elements(%(marks)s::json) AS m"
)


def workload(*, events: int, agents: int, agencies: int, seed: int) -> Iterator[Record]:
    """The records in the order they are produced (the same for a given seed)."""
    rng = random.Random(seed)
    agent_ids = [uuid.UUID(int=rng.getrandbits(128)) for _ in range(agents)]
    agency_ids = [uuid.UUID(int=rng.getrandbits(128)) for _ in range(agencies)]
    memberships = {a: rng.sample(agency_ids, rng.choice((1, 1, 1, 2))) for a in agent_ids}
    versions: dict[tuple[uuid.UUID, uuid.UUID], int] = {}
    sent: list[Record] = []
    for n in range(events):
        roll = rng.random()
        if roll < DUPLICATE_SHARE and sent:
            yield sent[rng.randrange(max(0, len(sent) - 5000), len(sent))]  # duplicate
            continue
        agent = rng.choice(agent_ids)
        agency = rng.choice(memberships[agent])
        version = versions.get((agent, agency), 0) + 1
        versions[(agent, agency)] = version
        if roll < DUPLICATE_SHARE + STALE_SHARE and version > STALE_BY:
            version -= STALE_BY  # a stale reorder: an older version arriving late
        left = version % 2 == 0
        payload = membership_event(
            agent,
            agency,
            version,
            "Left" if left else "Active",
            reason="SelfLeave" if left else None,
            effective_at=T0 + timedelta(minutes=n) if left else None,
            left_at=T0 + timedelta(minutes=n) if left else None,
            joined_at=T0,
        )
        envelope = envelope_for(payload)
        record_ = (kafka_key(envelope), encode(envelope), headers_for(envelope))
        sent.append(record_)
        if len(sent) > RECENT:
            del sent[: RECENT // 2]
        yield record_


def load(args: argparse.Namespace, bootstrap: str, topic: str) -> None:
    producer = create_producer(
        bootstrap, client_id="bench-loader", linger_ms=50, extra={"batch.size": 1_000_000}
    )
    shape = {"events": args.events, "agents": args.agents, "agencies": args.agencies}
    for key, value, headers in workload(**shape, seed=args.seed):
        while True:
            try:
                producer.produce(topic, key=key, value=value, headers=headers)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    if producer.flush(120):
        raise SystemExit("loader: messages still queued")


def _reader(bootstrap: str, topic: str, name: str) -> Consumer:
    """A consumer of a new group subscribed to `topic`, configured as the service's is."""
    consumer = create_consumer(
        bootstrap,
        group_id=f"bench-{name}-{uuid.uuid4().hex[:8]}",
        client_id=f"bench-{name}",
        # What build_consumer adds to the shared consumer config (fetch sizing).
        extra={"fetch.wait.max.ms": 100},
    )
    consumer.subscribe([topic])
    return consumer


def measure_plain(args: argparse.Namespace, bootstrap: str) -> dict[str, Any]:
    """(b) poll + msgspec-decode every record; no database."""
    consumer = _reader(bootstrap, args.topic, "plain")
    handled, first = 0, None
    try:
        while handled < args.events:
            messages = consumer.consume(num_messages=args.batch_size, timeout=0.5)
            for message in messages:
                if message.error() is None:
                    decode_membership_changed(message.value())
                    handled += 1
            if handled and first is None:
                first = time.monotonic()
    finally:
        consumer.close()
    return {"seconds": time.monotonic() - (first or time.monotonic()), "records": handled}


def measure_consumer(args: argparse.Namespace, bootstrap: str) -> dict[str, Any]:
    """(a) the real consumer loop until every record is handled and committed."""
    # WARNING by default, as at high volume; `--log-level INFO` measures the per-event lines
    # (`consumed`, `membership-applied`, ...) a service at its default level writes, to a
    # null stream so that the terminal is not what is timed.
    configure_logging(args.log_level, "rewards-membership-bench", stream=open(os.devnull, "w"))  # noqa: SIM115
    settings = Settings(
        database_dsn=Secret(args.dsn),
        kafka_bootstrap=bootstrap,
        topic=args.topic,
        dlq_topic=args.dlq,
        group_id=f"bench-{uuid.uuid4().hex[:8]}",
        batch_size=args.batch_size,
        poll_timeout=timedelta(milliseconds=500),
    )
    collect_less()  # as `consume` does (rewards_membership.app.run_consumer)
    metrics = Metrics()
    consumer, producer = build_consumer(settings, metrics=metrics, client_id="bench-consumer")
    consumer.subscribe()
    handled, first = 0, None
    try:
        while handled < args.events:
            count = consumer.poll_once()
            if count and first is None:
                first = time.monotonic()
            handled += count
    finally:
        consumer.close()  # finishes the batch in flight and commits it
        producer.flush(10)
    elapsed = time.monotonic() - (first or time.monotonic())

    def total(name: str) -> float:
        return sum(s.value for m in metrics.registry.collect() for s in m.samples if s.name == name)

    return {
        "seconds": elapsed,
        "records": handled,
        "applied": total("rewards_membership_applied_total"),
        "stale": total("rewards_membership_skipped_stale_total"),
        "duplicates": total("rewards_membership_skipped_duplicate_total"),
        "dlq": total("rewards_identity_membership_dlq_total"),
    }


def floor_batches(args: argparse.Namespace, bootstrap: str) -> list[tuple[str, str]]:
    """Per batch of the topic's records (read like the consumer reads them, `batch_size` at
    a time): (rows document, inbox document), decided in memory by the consumer's own
    planner against the state the batches before left. Untimed."""
    consumer = _reader(bootstrap, args.topic, "floor")
    seen: set[str] = set()
    rows: dict[RowKey, MembershipRow] = {}
    batches, read = [], 0
    try:
        while read < args.events:
            messages = consumer.consume(num_messages=args.batch_size, timeout=0.5)
            items = [validate(m.value()) for m in messages if m.error() is None]
            if not items:
                continue
            read += len(items)
            plan = plan_batch(items, seen, rows)
            seen.update(key for key, _ in plan.inbox)
            changed = plan.updates + plan.inserts
            rows.update((row.key, row) for row in changed)
            batches.append(
                (msgspec.json.encode(changed).decode(), msgspec.json.encode(plan.inbox).decode())
            )
    finally:
        consumer.close()
    return batches


def measure_floor(args: argparse.Namespace, bootstrap: str) -> dict[str, Any]:
    """(c) the same batches' rows and inbox keys, set-based, one transaction per batch."""
    batches = floor_batches(args, bootstrap)
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        started = time.monotonic()
        for rows_doc, marks_doc in batches:
            with conn.transaction(), conn.pipeline():
                conn.execute(FLOOR_UPSERT, {"rows": rows_doc})
                conn.execute(FLOOR_INBOX, {"marks": marks_doc})
        elapsed = time.monotonic() - started
    return {"seconds": elapsed, "records": args.events, "batches": len(batches)}


def child(
    kind: str, args: argparse.Namespace, *, pythonpath: str | None = None, **extra: str
) -> dict[str, Any]:
    """Run one measurement in a process of its own (its RSS and CPU are its own);
    `pythonpath`: a baseline's package directory, first on the process's path."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [sys.executable, __file__, "--measure", kind, "--result", out.name]
        for name in ("events", "agents", "agencies", "batch_size", "seed", "log_level"):
            command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
        for name, value in extra.items():
            command += [f"--{name}", value]
        env = None if pythonpath is None else os.environ | {"PYTHONPATH": pythonpath}
        started = time.monotonic()
        subprocess.run(command, check=True, env=env)
        result: dict[str, Any] = json.loads(Path(out.name).read_text())
        result["wall"] = time.monotonic() - started
        return result


def report(
    args: argparse.Namespace,
    plain: dict[str, Any],
    sides: dict[str, list[dict[str, Any]]],
    floor: dict[str, Any],
) -> None:
    """`sides`: every consumer's drains, round by round (this checkout's first); the
    comparisons take this checkout's median round."""
    real = median_round(sides[THIS])
    events = args.events
    rate = {
        name: events / r["seconds"]
        for name, r in (("plain", plain), ("real", real), ("floor", floor))
    }
    table = Table(
        title=f"rewards-membership: {events:,} events (5% duplicates, 5% stale), batch "
        f"{args.batch_size}; {os.cpu_count()} cores shared with PostgreSQL and Kafka",
        title_justify="left",
    )
    columns = ("measure", "seconds", "msgs/s", "consumer / this", "target", "peak RSS", "CPU-s")
    for column in columns:
        table.add_column(column, justify="left" if column == "measure" else "right")
    table.add_row(
        "(a) consumer (poll, decode, transaction, commit)",
        f"{real['seconds']:.1f}",
        f"{rate['real']:,.0f}",
        "",
        "",
        f"{real['rss_mib']:,.0f} MiB",
        f"{real['cpu']:.1f}",
    )
    table.add_row(
        "(b) plain confluent-kafka consumer: poll + msgspec decode",
        f"{plain['seconds']:.1f}",
        f"{rate['plain']:,.0f}",
        f"{rate['real'] / rate['plain']:.2f}",
        ">= 0.50",
        f"{plain['rss_mib']:,.0f} MiB",
        f"{plain['cpu']:.1f}",
    )
    table.add_row(
        f"(c) DB floor: set-based upsert + inbox insert, {floor['batches']} batches",
        f"{floor['seconds']:.1f}",
        f"{rate['floor']:,.0f}",
        f"{rate['real'] / rate['floor']:.2f} (time x{real['seconds'] / floor['seconds']:.2f})",
        "time <= x1.5",
        "",
        "",
    )
    Console(width=max(120, Console().width)).print(table)
    print(
        f"consumer: applied {real['applied']:,.0f}, stale {real['stale']:,.0f}, "
        f"duplicates {real['duplicates']:,.0f}, dlq {real['dlq']:,.0f}"
    )
    note = f"{events:,} events, batch {args.batch_size}, same run"
    if len(sides) > 1:
        report_sides(sides, real)
    consumer = Figure("consumer", rate["real"])
    client = Figure("plain consumer (poll + decode)", rate["plain"])
    record(Comparison.rate(BENCHMARK, consumer, client, unit="msgs/s", target=0.5, note=note))
    drain = Figure("consumer drain", real["seconds"])
    db_floor = Figure("DB floor (set-based, same batches)", floor["seconds"])
    record(Comparison.duration(BENCHMARK, drain, db_floor, target=1.5, note=note))


def median_round(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return sorted(rounds, key=lambda r: r["seconds"])[(len(rounds) - 1) // 2]


def report_sides(sides: dict[str, list[dict[str, Any]]], this: dict[str, Any]) -> None:
    """Each consumer side's drain and CPU, round by round, beside this checkout's."""
    table = Table(title="consumer sides, in turn in every round", title_justify="left")
    columns = ("consumer", "drain s (rounds)", "CPU-s (rounds)", "peak RSS", "drain / this")
    for column in (*columns, "applied, stale, duplicates, dlq"):
        table.add_column(column, justify="left" if column == "consumer" else "right")
    for name, rounds in sides.items():
        middle = median_round(rounds)
        outcomes = {
            tuple(int(r[k]) for k in ("applied", "stale", "duplicates", "dlq")) for r in rounds
        }
        table.add_row(
            name,
            ", ".join(f"{r['seconds']:.1f}" for r in rounds),
            ", ".join(f"{r['cpu']:.1f}" for r in rounds),
            f"{max(r['rss_mib'] for r in rounds):,.0f} MiB",
            f"{middle['seconds'] / this['seconds']:.2f}",
            "; ".join(", ".join(f"{n:,}" for n in o) for o in sorted(outcomes)),
        )
    Console(width=max(120, Console().width)).print(table)


@contextlib.contextmanager
def scratch_database(admin_dsn: str, name: str) -> Iterator[str]:
    """A migrated database of its own; yields the consumer's runtime-role DSN of it."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        dsn = psycopg.conninfo.make_conninfo(admin_dsn, dbname=name)
        run_migrations(dsn)
        ensure_login(admin_dsn, "rewards_membership_consumer")
        # As deployed: the consumer (and the floor) log in as the consumer's runtime role.
        yield runtime_dsn(dsn, "rewards_membership_consumer")
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def _measure(args: argparse.Namespace, bootstrap: str) -> None:
    result: dict[str, Any] = {}
    if args.measure == "load":
        load(args, bootstrap, args.topic)
    elif args.measure == "plain":
        result = measure_plain(args, bootstrap)
    elif args.measure == "consumer":
        result = measure_consumer(args, bootstrap)
    else:
        result = measure_floor(args, bootstrap)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result["rss_mib"] = usage.ru_maxrss / 1024
    result["cpu"] = usage.ru_utime + usage.ru_stime  # every thread, start-up included
    Path(args.result).write_text(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser()
    # The benchmark's workload is 1,000,000 events, the default (how long it takes with the
    # loading: README); `--events` runs a smaller one of the same shape.
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--agents", type=int, default=100_000)
    parser.add_argument("--agencies", type=int, default=1_000)
    parser.add_argument("--batch-size", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--log-level", default="WARNING", choices=("WARNING", "INFO"))
    parser.add_argument(
        "--baseline",
        metavar="REV",
        nargs="*",
        default=[],
        help="also drain with the consumer of each of these git revisions, in turn",
    )
    parser.add_argument("--rounds", type=int, default=1, help="drains of each consumer side")
    for hidden in ("--measure", "--result", "--topic", "--dlq", "--dsn"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args()
    bootstrap = os.environ["PIN_KAFKA_BOOTSTRAP"]
    if args.measure:
        _measure(args, bootstrap)
        return

    admin_dsn = os.environ["PIN_POSTGRES_DSN"]
    name = f"pin_bench_{uuid.uuid4().hex[:8]}"
    topic, dlq = f"bench.membership.{name}", f"bench.membership-dlq.{name}"
    admin = create_admin(bootstrap, client_id="bench")
    try:
        with tempfile.TemporaryDirectory(prefix="pin-bench-baseline-") as root:
            paths: dict[str, str | None] = {THIS: None}
            for n, revision in enumerate(args.baseline):
                paths[f"consumer @{revision}"] = checkout_package(
                    revision, os.path.join(root, str(n)), SOURCE
                )
            ensure_topics(admin, [(topic, 3), (dlq, 3)])
            loaded = child("load", args, topic=topic)
            print(f"loaded {args.events:,} events in {loaded['wall']:.1f}s")
            plain = child("plain", args, topic=topic)
            sides: dict[str, list[dict[str, Any]]] = {side: [] for side in paths}
            order = list(paths)
            for round_ in range(args.rounds):
                # Each round starts one side further: none always drains right after another.
                turn = round_ % len(order)
                for n, side in enumerate(order[turn:] + order[:turn]):
                    with scratch_database(admin_dsn, f"{name}_{round_}_{n}") as dsn:
                        sides[side].append(
                            child(
                                "consumer",
                                args,
                                pythonpath=paths[side],
                                topic=topic,
                                dlq=dlq,
                                dsn=dsn,
                            )
                        )
            with scratch_database(admin_dsn, f"{name}_floor") as floor_dsn:
                floor = child("floor", args, topic=topic, dsn=floor_dsn)
            report(args, plain, sides, floor)
    finally:
        admin.delete_topics([topic, dlq], operation_timeout=10)


if __name__ == "__main__":
    main()
