"""Benchmark: one rewards-membership consumer draining N membership events.

Loads the events with a child process (so RSS is the consumer's), then runs the real
consumer loop (`MembershipConsumer.poll_once`) until every record is handled.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
from psycopg import sql

from pin_contracts import AgentMembershipChanged, encode, envelope_for, headers_for, kafka_key
from pin_runtime.kafka import create_admin, create_producer, ensure_topics
from pin_runtime.logging import configure_logging
from pin_runtime.settings import Secret
from pin_testkit.runtime_roles import ensure_login, runtime_dsn
from rewards_membership.app import build_consumer, run_migrations
from rewards_membership.metrics import Metrics
from rewards_membership.settings import Settings

T0 = datetime(2025, 1, 1, tzinfo=UTC)
DUPLICATE_SHARE = 0.05
STALE_SHARE = 0.05
STALE_BY = 2  # a stale reorder re-sends the version two below the row's latest
RECENT = 20_000  # duplicates are drawn from the last records sent


def load(*, bootstrap: str, topic: str, events: int, agents: int, agencies: int, seed: int) -> None:
    rng = random.Random(seed)
    agent_ids = [uuid.UUID(int=rng.getrandbits(128)) for _ in range(agents)]
    agency_ids = [uuid.UUID(int=rng.getrandbits(128)) for _ in range(agencies)]
    memberships = {a: rng.sample(agency_ids, rng.choice((1, 1, 1, 2))) for a in agent_ids}
    versions: dict[tuple[uuid.UUID, uuid.UUID], int] = {}
    sent: list[tuple[bytes, bytes, list[tuple[str, str | bytes | None]]]] = []
    producer = create_producer(
        bootstrap, client_id="bench-loader", linger_ms=50, extra={"batch.size": 1_000_000}
    )
    for n in range(events):
        roll = rng.random()
        if roll < DUPLICATE_SHARE and sent:
            record = sent[rng.randrange(max(0, len(sent) - 5000), len(sent))]  # duplicate
        else:
            agent = rng.choice(agent_ids)
            agency = rng.choice(memberships[agent])
            version = versions.get((agent, agency), 0) + 1
            versions[(agent, agency)] = version
            if roll < DUPLICATE_SHARE + STALE_SHARE and version > STALE_BY:
                version -= STALE_BY  # a stale reorder: an older version arriving late
            left = version % 2 == 0
            payload = AgentMembershipChanged(
                membership_id=uuid.uuid5(agent, str(agency)),
                agent_user_id=agent,
                company_id=agency,
                status="Left" if left else "Active",
                reason="SelfLeave" if left else None,
                effective_at=T0 + timedelta(minutes=n) if left else None,
                version=version,
                left_at=T0 + timedelta(minutes=n) if left else None,
                joined_at=T0,
            )
            envelope = envelope_for(payload)
            record = (kafka_key(envelope), encode(envelope), headers_for(envelope))
            sent.append(record)
            if len(sent) > RECENT:
                del sent[: RECENT // 2]
        while True:
            try:
                producer.produce(topic, key=record[0], value=record[1], headers=record[2])
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    if producer.flush(120):
        raise SystemExit("loader: messages still queued")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--agents", type=int, default=100_000)
    parser.add_argument("--agencies", type=int, default=1_000)
    parser.add_argument("--batch-size", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--load-only", metavar="TOPIC", help=argparse.SUPPRESS)
    args = parser.parse_args()
    bootstrap = os.environ["PIN_KAFKA_BOOTSTRAP"]
    if args.load_only:
        load(
            bootstrap=bootstrap,
            topic=args.load_only,
            events=args.events,
            agents=args.agents,
            agencies=args.agencies,
            seed=args.seed,
        )
        return

    admin_dsn = os.environ["PIN_POSTGRES_DSN"]
    name = f"pin_bench_{uuid.uuid4().hex[:8]}"
    topic, dlq = f"bench.membership.{name}", f"bench.membership-dlq.{name}"
    admin = create_admin(bootstrap, client_id="bench")
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = psycopg.conninfo.make_conninfo(admin_dsn, dbname=name)
    try:
        run_migrations(dsn)
        ensure_login(admin_dsn, "rewards_membership_consumer")
        ensure_topics(admin, [(topic, 3), (dlq, 3)])
        started = time.monotonic()
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--load-only",
                topic,
                "--events",
                str(args.events),
                "--agents",
                str(args.agents),
                "--agencies",
                str(args.agencies),
                "--seed",
                str(args.seed),
            ],
            check=True,
        )
        print(f"loaded {args.events:,} events in {time.monotonic() - started:.1f}s")
        drain(
            dsn=runtime_dsn(dsn, "rewards_membership_consumer"),  # as deployed
            bootstrap=bootstrap,
            topic=topic,
            dlq=dlq,
            events=args.events,
            batch_size=args.batch_size,
        )
    finally:
        admin.delete_topics([topic, dlq], operation_timeout=10)
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def drain(*, dsn: str, bootstrap: str, topic: str, dlq: str, events: int, batch_size: int) -> None:
    configure_logging("WARNING", "rewards-membership-bench")
    settings = Settings(
        database_dsn=Secret(dsn),
        kafka_bootstrap=bootstrap,
        topic=topic,
        dlq_topic=dlq,
        group_id=f"bench-{uuid.uuid4().hex[:8]}",
        batch_size=batch_size,
        poll_timeout=timedelta(milliseconds=500),
    )
    metrics = Metrics()
    consumer, producer = build_consumer(settings, metrics=metrics, client_id="bench-consumer")
    consumer.subscribe()
    handled = 0
    first: float | None = None
    try:
        while handled < events:
            count = consumer.poll_once()
            if count and first is None:
                first = time.monotonic()
            handled += count
    finally:
        consumer.close()
        producer.flush(10)
    elapsed = time.monotonic() - (first or time.monotonic())
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def total(name: str) -> float:
        return sum(s.value for m in metrics.registry.collect() for s in m.samples if s.name == name)

    print(
        f"drained {handled:,} events in {elapsed:.1f}s: {handled / elapsed:,.0f} msgs/s "
        f"(batch {batch_size}, {os.cpu_count()} cores, PostgreSQL and Kafka on the same machine)"
    )
    print(
        f"applied {total('rewards_membership_applied_total'):,.0f}, "
        f"stale {total('rewards_membership_skipped_stale_total'):,.0f}, "
        f"duplicates {total('rewards_membership_skipped_duplicate_total'):,.0f}, "
        f"dlq {total('rewards_identity_membership_dlq_total'):,.0f}"
    )
    print(f"peak RSS of the consumer process: {peak_mb:,.0f} MiB")


if __name__ == "__main__":
    main()
