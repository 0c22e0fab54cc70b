"""The demo's membership part: agents join and leave agencies in identity; the rewards
projection follows through Kafka; a malformed record ends in the DLQ."""

from __future__ import annotations

import json
import random
import time
import uuid
from datetime import UTC, datetime

import psycopg
from demo_support import Service, console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from identity_fanout.membership import join_agency, leave_agency
from pin_contracts import encode, envelope_for
from pin_contracts.topics import AGENT_MEMBERSHIP_CHANGED
from pin_runtime.delivery import DeliveryTracker, flush_or_raise
from pin_runtime.kafka import create_producer
from pin_testkit.events import membership_event
from pin_testkit.runtime_roles import runtime_dsn
from pin_testkit.waiting import wait_until

AGENTS = 60
AGENCIES = 5
CONVERGE_WITHIN = 120  # seconds


def _record_changes(dsn: str) -> dict[tuple[uuid.UUID, uuid.UUID], tuple[str, int]]:
    """Joins, leaves and re-joins in identity; the expected final (status, version) per row."""
    rng = random.Random(7)  # noqa: S311 - demo data, not secrets
    agencies = [uuid.uuid4() for _ in range(AGENCIES)]
    expected: dict[tuple[uuid.UUID, uuid.UUID], tuple[str, int]] = {}
    # The identity side records them as the membership producer's runtime role.
    with psycopg.connect(runtime_dsn(dsn, "identity_membership_producer")) as db:
        for _ in range(AGENTS):
            agent = uuid.uuid4()
            for agency in rng.sample(agencies, rng.choice((1, 1, 2))):
                join_agency(db, agent, agency)
                expected[(agent, agency)] = ("Active", 1)
        for (agent, agency), _ in rng.sample(sorted(expected.items()), AGENTS // 3):
            reason = rng.choice(("SelfLeave", "ExcludedByAgency"))
            leave_agency(db, agent, agency, reason=reason)
            expected[(agent, agency)] = ("Left", 2)
        left = [key for key, (status, _) in expected.items() if status == "Left"]
        for agent, agency in left[:3]:
            join_agency(db, agent, agency)
            expected[(agent, agency)] = ("Active", 3)
        db.commit()
    return expected


def _inject_malformed(bootstrap: str) -> uuid.UUID:
    """A record with CompanyId = Guid.Empty: a contract violation the consumer dead-letters."""
    agent = uuid.uuid4()
    envelope = envelope_for(
        membership_event(
            agent, uuid.UUID(int=0), 1, joined_at=datetime.now(UTC), membership_id=uuid.uuid4()
        )
    )
    producer = create_producer(bootstrap, client_id="pin-demo")
    tracker = DeliveryTracker[int]()
    producer.produce(
        AGENT_MEMBERSHIP_CHANGED.name,
        key=str(agent).encode(),
        value=encode(envelope),
        on_delivery=tracker,
    )
    flush_or_raise(producer, 30, tracker)
    return agent


def _applied(rewards_dsn: str, expected: dict[tuple[uuid.UUID, uuid.UUID], tuple[str, int]]) -> int:
    agents = [a for a, _ in expected]
    companies = [c for _, c in expected]
    with psycopg.connect(rewards_dsn) as db:
        rows = db.execute(
            "SELECT ap.agent_user_id, ap.company_id, ap.membership_status, "
            "ap.last_membership_version FROM rewards.agent_performance ap "
            "JOIN unnest(%s::uuid[], %s::uuid[]) AS k (a, c) "
            "ON ap.agent_user_id = k.a AND ap.company_id = k.c",
            (agents, companies),
        ).fetchall()
    return sum(1 for a, c, status, version in rows if expected[(a, c)] == (status, version))


def memberships(
    worker: Service, consumer: Service, identity_dsn: str, rewards_dsn: str, bootstrap: str
) -> None:
    agent, agency = uuid.uuid4(), uuid.uuid4()
    console.print(worker.run("memberships", "join", str(agent), str(agency)))
    with console.status(f"recording membership changes of {AGENTS} agents in {AGENCIES} agencies"):
        expected = _record_changes(identity_dsn)
    console.print(
        worker.run("memberships", "leave", str(agent), str(agency), "--reason", "SelfLeave")
    )
    expected[(agent, agency)] = ("Left", 2)
    bad_agent = _inject_malformed(bootstrap)
    started = time.monotonic()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        rows = progress.add_task("projection rows in their final state", total=len(expected))
        while (done := _applied(rewards_dsn, expected)) < len(expected):
            progress.update(rows, completed=done)
            if time.monotonic() - started > CONVERGE_WITHIN:
                raise TimeoutError(f"the projection did not converge in {CONVERGE_WITHIN} s")
            time.sleep(0.2)  # a person watches: five refreshes a second
        progress.update(rows, completed=done)

    def dead_lettered() -> bool:
        # --json: one object per record, alone on stdout (the log is on stderr).
        listed = consumer.run("dlq", "list", "--json", quiet=True).splitlines()
        return any(json.loads(line)["key"] == str(bad_agent) for line in listed)

    wait_until(dead_lettered, 60, "the malformed record in the DLQ", interval=0.2)
    multi = next(a for a, _ in expected if sum(1 for b, _ in expected if b == a) > 1)
    console.print(consumer.run("agent", "show", str(multi)), soft_wrap=True)
    console.print(consumer.run("dlq", "list"), soft_wrap=True)

    summary = Table(title="Agent membership", title_justify="left", show_header=False)
    summary.add_column("what", style="bold")
    summary.add_column("value")
    summary.add_row("membership changes recorded in identity", f"{_count(expected):,}")
    summary.add_row("projection rows in their final state", f"{len(expected):,}")
    summary.add_row("malformed record", f"key {bad_agent}: in the DLQ with its reason")
    summary.add_row("consumer metrics", f"http://127.0.0.1:{consumer.port}/metrics")
    console.print(summary)


def _count(expected: dict[tuple[uuid.UUID, uuid.UUID], tuple[str, int]]) -> int:
    return sum(version for _, version in expected.values())
