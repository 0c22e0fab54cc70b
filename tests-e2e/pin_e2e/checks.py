"""What the scenarios verify, from the public surfaces: the databases and the topics."""

from __future__ import annotations

import random
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import dict_row

from pin_contracts import (
    ContractViolation,
    Envelope,
    LeaveReason,
    UserAccessChangedKafkaEvent,
    decode_access_changed,
)
from pin_testkit.records import Record

__all__ = [
    "AccessDelivery",
    "MembershipPlan",
    "PlannedChange",
    "analyse_access",
    "expected_snapshots",
    "identity_memberships",
    "membership_differences",
    "rewards_rows",
]

SnapshotKey = tuple[str, ...]


def _snapshot_key(values: Iterable[object]) -> SnapshotKey:
    return tuple("" if v is None else str(v) for v in values)


def expected_snapshots(identity_dsn: str, users: Sequence[UUID]) -> dict[UUID, set[SnapshotKey]]:
    """Each user's active assignments now, straight from identity's tables (the truth)."""
    query = """
        SELECT a.user_id, a.id, a.role_id, r.code, a.scope_type, a.scope_organization_id,
               a.scope_project_group_id, a.scope_project_id, a.expires_at
          FROM identity.role_assignments a
          JOIN identity.role_definitions r ON r.id = a.role_id
         WHERE a.user_id = ANY(%s) AND a.status = 'Active'
           AND (a.expires_at IS NULL OR a.expires_at > now())
    """
    expected: dict[UUID, set[SnapshotKey]] = {u: set() for u in users}
    with psycopg.connect(identity_dsn, autocommit=True) as conn:
        for row in conn.execute(query, (list(users),)).fetchall():
            expected[row[0]].add(_snapshot_key(row[1:]))
    return expected


@dataclass
class AccessDelivery:
    """What ``pin.identity.access.v1`` says about one role change (one Version)."""

    users: int
    delivered: int = 0  # users with at least one event of the Version
    lost: list[UUID] = field(default_factory=list)
    fanout_duplicates: int = 0  # extra events with a new MessageId: a re-run fan-out batch
    relay_redeliveries: int = 0  # the same MessageId again: the relay re-sent an unacked row
    wrong_snapshots: list[UUID] = field(default_factory=list)
    wrong_fields: list[str] = field(default_factory=list)
    correlation_ids: set[str] = field(default_factory=set)
    events: int = 0
    max_fanout_copies: int = 0

    @property
    def duplicates(self) -> int:
        return self.fanout_duplicates + self.relay_redeliveries

    @property
    def distinct_events(self) -> int:
        """Events the producer wrote (distinct MessageIds), however often each was sent."""
        return self.delivered + self.fanout_duplicates


def analyse_access(
    records: Sequence[Record],
    *,
    users: Mapping[UUID, set[SnapshotKey]],
    version: int,
    company_id: UUID | None = None,
) -> AccessDelivery:
    """Check every event of ``users`` at ``version``: full snapshot, key, fields, copies."""
    delivery = AccessDelivery(users=len(users))
    message_ids: dict[UUID, Counter[UUID]] = defaultdict(Counter)
    for record in records:
        try:
            envelope: Envelope[UserAccessChangedKafkaEvent] = decode_access_changed(record.value)
        except ContractViolation as exc:
            delivery.wrong_fields.append(f"{record.partition}/{record.offset}: {exc}")
            continue
        event = envelope.payload
        if event.user_id not in users or event.version != version:
            continue
        delivery.events += 1
        message_ids[event.user_id][envelope.message_id] += 1
        if envelope.correlation_id is not None:
            delivery.correlation_ids.add(envelope.correlation_id)
        if record.key != str(event.user_id).encode():
            delivery.wrong_fields.append(f"{event.user_id}: key {record.key!r}")
        if event.change_reason != "RolePermissionsChanged":
            delivery.wrong_fields.append(f"{event.user_id}: ChangeReason {event.change_reason}")
        if company_id is not None and event.company_id != company_id:
            delivery.wrong_fields.append(f"{event.user_id}: CompanyId {event.company_id}")
        got = {
            _snapshot_key(
                (
                    a.assignment_id,
                    a.role_id,
                    a.role_code,
                    a.scope_type,
                    a.scope_organization_id,
                    a.scope_project_group_id,
                    a.scope_project_id,
                    a.expires_at,
                )
            )
            for a in event.active_assignments
        }
        if len(event.active_assignments) != len(got) or got != users[event.user_id]:
            delivery.wrong_snapshots.append(event.user_id)
    for user in users:
        copies = message_ids.get(user)
        if not copies:
            delivery.lost.append(user)
            continue
        delivery.delivered += 1
        delivery.fanout_duplicates += len(copies) - 1
        delivery.relay_redeliveries += sum(copies.values()) - len(copies)
        delivery.max_fanout_copies = max(delivery.max_fanout_copies, len(copies))
    return delivery


# -- memberships -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PlannedChange:
    agent: UUID
    agency: UUID
    join: bool
    reason: LeaveReason | None = None
    effective_at: datetime | None = None
    invitation: UUID | None = None


@dataclass
class MembershipPlan:
    """A random but reproducible sequence of joins and leaves, and the state it ends in.

    Each agent moves among a few agencies of its own, so pairs see joins, leaves and re-joins
    (Version 1, 2, 3, ...) rather than one join each.
    """

    agents: list[UUID]
    agencies: list[UUID]
    changes: list[PlannedChange]
    final: dict[tuple[UUID, UUID], tuple[bool, int]]  # pair -> (active, version)

    @classmethod
    def random(
        cls, *, agents: int, agencies: int, changes: int, seed: int, per_agent: int = 3
    ) -> MembershipPlan:
        rng = random.Random(seed)
        agent_ids = [uuid.UUID(int=rng.getrandbits(128), version=4) for _ in range(agents)]
        agency_ids = [uuid.UUID(int=rng.getrandbits(128), version=4) for _ in range(agencies)]
        haunts = {a: rng.sample(agency_ids, per_agent) for a in agent_ids}
        state: dict[tuple[UUID, UUID], tuple[bool, int]] = {}
        planned: list[PlannedChange] = []
        deferred = datetime.now(UTC) + timedelta(days=30)
        for _ in range(changes):
            agent = rng.choice(agent_ids)
            agency = rng.choice(haunts[agent])
            active, version = state.get((agent, agency), (False, 0))
            if active:
                reason = rng.choice([LeaveReason.SELF_LEAVE, LeaveReason.EXCLUDED_BY_AGENCY])
                effective = deferred if rng.random() < 0.2 else None
                planned.append(PlannedChange(agent, agency, False, reason, effective))
            else:
                invitation = uuid.uuid4() if rng.random() < 0.3 else None
                planned.append(PlannedChange(agent, agency, True, invitation=invitation))
            state[(agent, agency)] = (not active, version + 1)
        return cls(agent_ids, agency_ids, planned, state)


def identity_memberships(
    identity_dsn: str, agents: Sequence[UUID]
) -> dict[tuple[UUID, UUID], dict[str, Any]]:
    query = """
        SELECT agent_user_id, company_id, status, reason, effective_at, left_at, version
          FROM identity.agent_memberships WHERE agent_user_id = ANY(%s)
    """
    return _by_agent_and_company(identity_dsn, query, agents)


def rewards_rows(
    rewards_dsn: str, agents: Sequence[UUID]
) -> dict[tuple[UUID, UUID], dict[str, Any]]:
    query = """
        SELECT agent_user_id, company_id, membership_status AS status,
               leave_reason AS reason, effective_at, left_at, last_membership_version,
               version AS applied
          FROM rewards.agent_performance WHERE agent_user_id = ANY(%s)
    """
    return _by_agent_and_company(rewards_dsn, query, agents)


def _by_agent_and_company(
    dsn: str, query: str, agents: Sequence[UUID]
) -> dict[tuple[UUID, UUID], dict[str, Any]]:
    """Each row's other columns by name, keyed by (agent_user_id, company_id)."""
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        rows = conn.execute(query, (list(agents),)).fetchall()
    return {(r.pop("agent_user_id"), r.pop("company_id")): r for r in rows}


def membership_differences(
    plan_final: Mapping[tuple[UUID, UUID], tuple[bool, int]] | None,
    identity: Mapping[tuple[UUID, UUID], Mapping[str, Any]],
    rewards: Mapping[tuple[UUID, UUID], Mapping[str, Any]],
) -> list[str]:
    """Where the rewards projection differs from identity (and identity from the plan).

    ``applied`` (rewards' row version, +1 per applied change) must equal identity's Version:
    every change applied exactly once, none skipped, none applied twice.
    """
    problems: list[str] = []
    if plan_final is not None:
        for pair, (active, version) in plan_final.items():
            row = identity.get(pair)
            want = "Active" if active else "Left"
            if row is None or (row["status"], row["version"]) != (want, version):
                problems.append(f"identity {pair}: {row} != {want} v{version}")
    for pair, source in identity.items():
        row = rewards.get(pair)
        if row is None:
            problems.append(f"rewards {pair}: missing (identity {source['status']})")
            continue
        expected = {
            "status": source["status"],
            "reason": source["reason"],
            "effective_at": source["effective_at"],
            "left_at": source["left_at"],
            "last_membership_version": source["version"],
            "applied": source["version"],
        }
        actual = {k: row[k] for k in expected}
        if actual != expected:
            problems.append(f"rewards {pair}: {actual} != {expected}")
    problems.extend(f"rewards {pair}: not in identity" for pair in rewards if pair not in identity)
    return problems
