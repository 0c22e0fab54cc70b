"""Scenario 8: one poison record on each side of a running system; nothing stops, alerts fire.

The chart's topology: `worker --no-relay`, the relay as its own process, the consumer, and a
real Prometheus scraping all three with the repository's alert rules.

- Relay side: one user of a 300-user role also holds so many other assignments that their
  access snapshot is larger than the producer accepts. The relay quarantines that row and
  every other user of the role, and a membership change recorded after it, still arrive.
- Consumer side: an event with an empty CompanyId and a large unknown field, just under the
  membership topic's `max.message.bytes`: the broker accepts it, its dead-letter copy (the
  same bytes plus the DLQ headers) is too large for the DLQ topic. A small reference record
  takes its place in the DLQ, and the changes behind it are applied.

Nothing is lost: every user is delivered or quarantined (listed by the CLI, with the reason),
every membership change is applied exactly once, and the poison event is in the DLQ. Both
poison records raise their alert in Prometheus.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import msgspec
import psycopg
import pytest
from pin_e2e.checks import PlannedChange, analyse_access, expected_snapshots
from pin_e2e.poison import oversized_dead_letter_event
from pin_e2e.report import Recorder
from pin_e2e.steps import (
    change_role_permissions,
    projection_converged,
    record_changes_cli,
    seed_role,
)
from pin_e2e.system import System

from pin_contracts import (
    AGENT_MEMBERSHIP_CHANGED,
)
from pin_testkit.local.prometheus import PrometheusServer
from pin_testkit.private_servers import PrivateServers
from pin_testkit.records import produce
from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration

USERS = 300
WHALE_ASSIGNMENTS = 60_000
"""About 14 MB of snapshot: well above what the relay's producer accepts for one record."""
QUARANTINE_ALERT = "IdentityOutboxQuarantined"
DEAD_LETTER_ALERT = "RewardsMembershipDeadLetters"


def give_whale_assignments(system: System, user: uuid.UUID, count: int) -> None:
    """``count`` more Active Project-scope assignments of another role for ``user``."""
    with psycopg.connect(system.identity_dsn) as conn:
        bulk = uuid.uuid4()
        conn.execute(
            "INSERT INTO identity.role_definitions (id, code) VALUES (%s, 'bulk-projects')", (bulk,)
        )
        conn.execute(
            """
            INSERT INTO identity.role_assignments (id, role_id, user_id, scope_type,
                                                   scope_project_id)
            SELECT gen_random_uuid(), %(role)s, %(user)s, 'Project', gen_random_uuid()
              FROM generate_series(1, %(count)s)
            """,
            {"role": bulk, "user": user, "count": count},
        )


def test_one_poison_record_on_each_side_stops_nothing(
    e2e_servers: PrivateServers,
    make_system: Callable[[str], System],
    recorder: Recorder,
    tmp_path: Path,
) -> None:
    with (
        recorder.scenario(
            8, "poison record on each side: quarantine, DLQ reference, alerts"
        ) as stats,
        PrometheusServer(tmp_path / "prometheus") as prometheus,
    ):
        system = make_system("s8")
        code = "s8.role"
        role, users = seed_role(system, users=USERS, code=code)
        whale = users[USERS // 2]
        give_whale_assignments(system, whale, WHALE_ASSIGNMENTS)

        worker = system.worker("worker", "--no-relay").start()
        relay = system.relay().start()
        consumer = system.consumer().start()
        for process, job in (
            (worker, "identity-fanout"),
            (relay, "identity-fanout"),
            (consumer, "rewards-membership"),
        ):
            process.wait_ready()
            prometheus.scrape(job, f"127.0.0.1:{process.metrics_port}")
        alive = [worker, relay, consumer]

        # Relay side: the role change fans out; the whale's event cannot be published.
        change = change_role_permissions(system, role, code)
        assert change.mode == "queued", change
        stats.fault(f"a user with {WHALE_ASSIGNMENTS:,} assignments (snapshot over the limit)")

        # Consumer side: the poison event, then changes behind it.
        agents = [uuid.uuid4() for _ in range(3)]
        agency = uuid.uuid4()
        projection_matches = projection_converged(system, agents)
        record_changes_cli(system, [PlannedChange(agents[0], agency, True)])
        limit = AGENT_MEMBERSHIP_CHANGED.max_message_bytes
        produce(
            system.bootstrap,
            AGENT_MEMBERSHIP_CHANGED.name,
            [oversized_dead_letter_event(limit)],
            max_message_bytes=limit,
        )
        stats.fault("an invalid event whose dead-letter copy is too large for the DLQ")
        record_changes_cli(
            system,
            [PlannedChange(agents[1], agency, True), PlannedChange(agents[2], agency, True)],
        )

        others = [u for u in users if u != whale]
        wait_until(
            lambda: {r.key for r in system.access_records()} >= {str(u).encode() for u in others},
            timeout=120,
            what="every user of the role but the whale delivered",
            interval=0.5,
            alive=alive,
        )
        wait_until(
            projection_matches, timeout=60, what="changes behind the poison applied", alive=alive
        )

        # Nothing lost: the whale's event is in the quarantine, with its reason.
        listed = system.identity_cli("outbox", "quarantine", "list", "--json").stdout
        [quarantined] = [msgspec.json.decode(line) for line in listed.splitlines()]
        assert quarantined["error_reason"] == "too-large", quarantined
        assert quarantined["key"] == str(whale), quarantined
        shown = msgspec.json.decode(
            system.identity_cli(
                "outbox", "quarantine", "show", str(quarantined["id"]), "--json"
            ).stdout
        )
        assert (shown["key"], shown["error_code"]) == (str(whale), "MSG_SIZE_TOO_LARGE"), shown
        expected = expected_snapshots(system.identity_dsn, others)
        delivery = analyse_access(system.access_records(), users=expected, version=change.version)
        assert delivery.lost == [], delivery
        assert delivery.wrong_snapshots == [], delivery
        assert delivery.wrong_fields == [], delivery
        assert delivery.delivered == len(others)
        assert str(whale).encode() not in {r.key for r in system.access_records()}

        # Nothing lost on the consumer side: the poison is in the DLQ as a reference record.
        dead = system.dlq_records()
        assert len(dead) == 1, [(r.partition, r.offset) for r in dead]
        assert len(dead[0].value or b"") < 64 * 1024

        wait_until(
            lambda: {QUARANTINE_ALERT, DEAD_LETTER_ALERT} <= prometheus.firing(),
            timeout=120,
            what=f"{QUARANTINE_ALERT} and {DEAD_LETTER_ALERT} firing",
            interval=1.0,
            alive=alive,
        )
        stats.events = len(system.access_records()) + len(system.membership_records())
        stats.lost = 0
        stats.notes.append(f"alerts firing: {sorted(prometheus.firing())}")
        for process in (consumer, relay, worker):
            assert process.terminate() == 0
