"""The campaign's steady workload: role changes, membership joins and leaves, poison records.

The driver is the platform's API, not a process under test: it writes straight to
identity's database (not through a proxy) and carries on through the faults, retrying what
failed. A write whose COMMIT was cut off has an unknown outcome, so the driver never keeps
its own idea of the truth: identity's final state is what the invariants compare with.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Final
from uuid import UUID

import psycopg
from psycopg.rows import TupleRow

from identity_fanout.errors import IdentityFanoutError
from identity_fanout.fanout.enqueue import set_role_permissions
from identity_fanout.membership import join_agency, leave_agency
from identity_fanout.outbox.writer import OutboxMessage
from identity_fanout.schema import OUTBOX
from pin_contracts import AGENT_MEMBERSHIP_CHANGED, LeaveReason
from pin_testkit.seeding import add_permissions, seed_role_with_users

__all__ = ["Driver", "Role", "seed_roles", "write_relay_poison"]

log = logging.getLogger(__name__)

INLINE_THRESHOLD: Final = 50  # the workers' INLINE_FANOUT_THRESHOLD in the campaign
PERMISSION_SETS: Final = (("read",), ("read", "write"), ("write",))
"""A role's permissions go round these; it is seeded with the first (`seed_role_with_users`)."""


@dataclass(frozen=True, slots=True)
class Role:
    code: str
    id: UUID
    users: tuple[UUID, ...]


def seed_roles(identity_dsn: str, sizes: dict[str, int]) -> list[Role]:
    """Disjoint roles of the given sizes (each user also holds two other roles)."""
    roles: list[Role] = []
    with psycopg.connect(identity_dsn) as conn:
        for code, users in sizes.items():
            role, user_ids = seed_role_with_users(conn, users=users, other_roles=2, code=code)
            add_permissions(conn, [f"{code}.{p}" for p in ("read", "write")])
            roles.append(Role(code, role, tuple(user_ids)))
    return roles


def write_relay_poison(identity_dsn: str, size: int) -> UUID:
    """An outbox row the broker refuses for good (over the membership topic's limit, random
    bytes that no codec shrinks); its message id."""
    message = OutboxMessage(
        topic=AGENT_MEMBERSHIP_CHANGED.name,
        key=str(uuid.uuid4()),
        value=os.urandom(size),
        headers=(),
        message_id=uuid.uuid4(),
        event_type="AgentMembershipChanged",
    )
    with psycopg.connect(identity_dsn) as conn:
        OUTBOX.write(conn, [message])
    return message.message_id


@dataclass
class Driver:
    """Role changes every `role_every` s and membership changes every `membership_every` s,
    in a thread, until `stop()`."""

    identity_dsn: str
    roles: list[Role]
    seed: int
    role_every: float = 4.0
    membership_every: float = 0.2
    agents: int = 40
    agencies: int = 6
    # What the run did, counted as it goes: not settings.
    role_changes: int = field(init=False, default=0)
    membership_changes: int = field(init=False, default=0)
    failures: int = field(init=False, default=0)
    agent_ids: list[UUID] = field(init=False, default_factory=list)
    _stop: threading.Event = field(init=False, default_factory=threading.Event)
    _thread: threading.Thread | None = field(init=False, default=None)

    def start(self) -> Driver:
        rng = random.Random(self.seed)
        self.agent_ids = [
            uuid.UUID(int=rng.getrandbits(128), version=4) for _ in range(self.agents)
        ]
        agencies = [uuid.UUID(int=rng.getrandbits(128), version=4) for _ in range(self.agencies)]
        self._thread = threading.Thread(
            target=self._run, args=(rng, agencies), name="chaos-driver", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
            assert not self._thread.is_alive(), "the workload driver did not stop"

    def change_every_role(self) -> None:
        """One more change of each role (after the faults: the measured last changes)."""
        with psycopg.connect(self.identity_dsn, autocommit=True, connect_timeout=5) as conn:
            for role in self.roles:
                self._change_role(conn, role)

    def _change_role(self, conn: psycopg.Connection[TupleRow], role: Role) -> None:
        """The set after the role's current one: always a change, so a new Version to fan
        out. A set equal to the current one changes nothing, and a role whose every change
        was such a no-op would be expected at its seeded Version, which no event carries.
        The current set is read, not remembered: a change whose COMMIT went unanswered in a
        fault may have committed."""
        current = sorted(
            row[0]
            for row in conn.execute(
                "SELECT permission_code FROM identity.role_permissions WHERE role_id = %s",
                (role.id,),
            )
        )
        sets = [sorted(f"{role.code}.{p}" for p in names) for names in PERMISSION_SETS]
        perms = sets[(sets.index(current) + 1) % len(sets)] if current in sets else sets[0]
        change = set_role_permissions(conn, role.id, perms, inline_threshold=INLINE_THRESHOLD)
        assert change.mode != "unchanged", f"{role.code}: {perms} is its current set"
        self.role_changes += 1

    def _run(self, rng: random.Random, agencies: list[UUID]) -> None:
        next_role = time.monotonic()
        conn: psycopg.Connection[TupleRow] | None = None
        while not self._stop.is_set():
            try:
                if conn is None or conn.closed:
                    # A lock held by a fault (hot rows) fails a role change in 2 s
                    # instead of holding up the memberships behind it.
                    conn = psycopg.connect(
                        self.identity_dsn,
                        autocommit=True,
                        connect_timeout=3,
                        options="-c lock_timeout=2s",
                    )
                if time.monotonic() >= next_role:
                    role = rng.choice(self.roles)
                    next_role = time.monotonic() + self.role_every
                    self._change_role(conn, role)
                self._membership(conn, rng, agencies)
            except (psycopg.Error, IdentityFanoutError) as exc:
                self.failures += 1
                log.debug("workload write failed (retried): %s", exc)
                if conn is not None and isinstance(exc, psycopg.OperationalError):
                    conn.close()
                    conn = None
            self._stop.wait(self.membership_every)  # the pace of the load, not a wait
        if conn is not None:
            conn.close()

    def _membership(
        self, conn: psycopg.Connection[TupleRow], rng: random.Random, agencies: list[UUID]
    ) -> None:
        agent, agency = rng.choice(self.agent_ids), rng.choice(agencies)
        row = conn.execute(
            "SELECT status FROM identity.agent_memberships"
            " WHERE agent_user_id = %s AND company_id = %s",
            (agent, agency),
        ).fetchone()
        if row is not None and row[0] == "Active":
            reason = rng.choice([LeaveReason.SELF_LEAVE, LeaveReason.EXCLUDED_BY_AGENCY])
            leave_agency(conn, agent, agency, reason=reason)
        else:
            join_agency(conn, agent, agency)
        self.membership_changes += 1
