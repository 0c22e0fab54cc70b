"""The relay's pure decisions: who publishes which rows (lanes), what becomes of each row
once Kafka has answered (settle), and when the relay pauses for a refusal of the cluster
(pause). No I/O: `relay.OutboxRelay` holds the state and runs the statements; these
functions decide, and the tests prove them without a database or a broker
(`tests/test_lanes.py`, `tests/test_relay_settlement.py`, `tests/test_relay_pause.py`).

Lanes
-----
Lanes of the outbox: which relay instance publishes which rows. Pure.

Every outbox row carries the slot of its message key (its `key_slot` column): the first byte
of the key's sha256 modulo `SLOTS`, computed by the database when the row is written (the
SQL function `OutboxTables.key_slot_function`, the one definition of it) and never changed.
A lane is a group of slots (`slot % lanes == lane`); `lanes` is a relay setting. A relay
instance publishes a slot only while it holds that slot's session advisory lock, so the rows
of one key (one slot, whatever the lane count) have one publisher at a time and go out in
outbox id order.

Because exclusion is per slot, the lane count may differ between instances for a while
(a rolling change of the setting): two instances never hold the same slot, and a lane one
of them cannot take whole is simply left to the other until the rollout ends.

Balancing: each instance aims at `ceil(lanes / instances)` lanes. One below its share takes
free lanes; one above it gives back its surplus (after the lane's in-flight records are
settled), so a newcomer gets its share and a dead instance's lanes (its locks end with its
connection) are taken by the others at their next look.

Advisory locks need no privilege: any session of the database can take them. Only the
sessions of logins that may be relays count as instances; a slot another login holds
stays unpublished while it does, so it is logged and exported for an alert
(`foreign_holders`), and `migrate` revokes CONNECT from PUBLIC so that only the service's
own logins connect at all.

Settle
------
What a round of the relay does with each row, once Kafka has answered. Pure.

The rows of a round are walked in outbox id order:

- acknowledged by the broker: delete it;
- refused with a non-retriable error (`pin_runtime.delivery.classify`: too large, invalid
  record, invalid topic name): quarantine it — it would be refused again whatever the
  broker's health, and it must not hold up the rows behind it;
- refused with a retriable error (broker down, timeout, not leader, queue full) or by the
  cluster (not authorized, not authenticated, no such topic: Pause, below), or without
  an outcome (still in flight when the wait ended, never produced): the round stops here.
  This row and every row after it stay in the outbox for the next round, acknowledged or
  not: a re-send may duplicate a record, but a later row of the same key never overtakes
  one that may yet be delivered, and nothing is lost.

Frontier
--------
How far each slot may be read. Pure.

A writer takes a row's id before it commits, so rows may commit out of id order. Each
writing transaction holds the shared lock (writer class, slot) of every slot it writes from
before its first id there until it ends (migration 0012), so the transactions that may still
commit a row of a slot are the holders of its lock; right after its first id it also shows
that id (migration 0013), and none of its rows is below it. A step reads the last id handed
out, then the holders: a slot is settled at once up to that id, or to below the lowest
first id of its holders. A holder that shows no first id yet (it is between its first id
and the lock on it, or its table's trigger does not show one) makes that bound wait until
every such holder of that moment has ended. A relay reads a slot only up to its frontier, so
no row ever commits below what it read: a key's rows go out in id order, and a row waits
only for the transactions that hold its own slot and took an id before it.

Pause
-----
When the relay pauses for a refusal of the cluster, and when it resumes. Pure.

A cluster-wide refusal (`pin_runtime.delivery.CLUSTER_WIDE`: the relay's principal may not
write a topic or use the cluster, its credentials are refused, the topic does not exist)
would refuse every row behind the first one alike, so it is never a reason to quarantine:
the relay stops there as for an outage (the rows stay in the outbox in id order, nothing is
quarantined or deleted), retries with backoff and goes on by itself once Kafka takes a row
again. A topic with fewer partitions than the catalogue's is refused alike (partition-count:
its records name partitions that may not exist, `partitions`). Unlike an outage it needs an
operator, so it says so: one log line when the relay pauses (or the refusal changes), one
when it resumes, a gauge by reason and topic, and readiness degraded meanwhile
(`relay.OutboxRelay` keeps the state; this module decides).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import takewhile
from typing import TYPE_CHECKING, Final, NamedTuple

from identity_fanout.outbox.records import OutboxRecord

if TYPE_CHECKING:
    # Annotations only: the operator commands import the lanes' rules, and
    # `pin_runtime.delivery` loads the Kafka client they never need.
    from pin_runtime.delivery import DeliveryFailure

__all__ = [
    "DEFAULT_LANES",
    "MAX_LANES",
    "SLOTS",
    "TOPIC_REFUSALS",
    "ForeignHolder",
    "LaneLock",
    "LanePlan",
    "Pause",
    "Refusal",
    "Settlement",
    "SlotWait",
    "advance_frontier",
    "foreign_holders",
    "lane_of_slot",
    "lock_class",
    "next_pause",
    "plan_lanes",
    "refusal_of",
    "relay_instances",
    "settle",
    "share",
    "slots_of",
]

# -- lanes -------------------------------------------------------------------------------

SLOTS: Final = 64
"""Fixed for good (the modulus of the slot function of migration 0008): a key's slot is
stored with its rows, and a different modulus would move keys between slots while rows
wait. The lane count is at most this."""
MAX_LANES: Final = SLOTS
DEFAULT_LANES: Final = 8
"""`IDENTITY_FANOUT_OUTBOX_LANES` unless set."""


def lock_class(name: str) -> int:
    """A positive int4 advisory-lock class from a name: sha256's first 4 bytes, top bit off
    (positive, so it reads the same in `pg_locks.classid`, an unsigned oid). The lanes'
    classes are named after the outbox table (`OutboxTables.lane_lock_class`)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big") & 0x7FFFFFFF


# -- frontier ----------------------------------------------------------------------------


class SlotWait(NamedTuple):
    """A slot's frontier candidate: settled once every transaction in `writers` has ended."""

    upto: int
    """The bound of the step that took the candidate."""
    writers: frozenset[str]
    """The transactions holding the slot's writer lock just after, without a first id
    (pg_locks' `virtualtransaction`: unique per transaction, a prepared one's too)."""


def advance_frontier(
    frontier: Sequence[int],
    waits: Mapping[int, SlotWait],
    last: int,
    writers: Mapping[int, frozenset[str]],
    firsts: Mapping[str, int],
) -> tuple[list[int], dict[int, SlotWait]]:
    """One step of every slot's frontier: `last` is the last id handed out, `writers` the
    holders of each slot's writer lock read after it, `firsts` the first id of each holder
    that showed one. A waiting candidate whose writers have all ended becomes the frontier;
    the slot's bound (`last`, or below its holders' lowest first id) is its frontier at once
    if every holder showed a first id, else it waits for those that did not (unless a
    candidate already waits). The next frontier and waits."""
    advanced = list(frontier)
    left: dict[int, SlotWait] = {}
    for slot in range(SLOTS):
        holders = writers.get(slot, frozenset())
        wait = waits.get(slot)
        if wait is not None and not wait.writers & holders:
            advanced[slot] = max(advanced[slot], wait.upto)
            wait = None
        bound = min((firsts[h] - 1 for h in holders if h in firsts), default=last)
        bound = min(bound, last)
        unknown = frozenset(h for h in holders if h not in firsts)
        if not unknown:
            advanced[slot] = max(advanced[slot], bound)
        elif wait is None:
            wait = SlotWait(bound, unknown)
        if wait is not None and wait.upto > advanced[slot]:
            left[slot] = wait
    return advanced, left


def lane_of_slot(slot: int, lanes: int) -> int:
    return slot % lanes


def slots_of(lanes_held: Iterable[int], lanes: int) -> list[int]:
    """Every slot of the given lanes, ascending."""
    wanted = set(lanes_held)
    return [s for s in range(SLOTS) if s % lanes in wanted]


def share(lanes: int, instances: int) -> int:
    """Lanes one instance aims at: ceil(lanes / instances), every lane covered."""
    return -(-lanes // max(1, instances))


class LaneLock(NamedTuple):
    """One advisory lock of the lanes and the session holding it (`lane_locks`)."""

    member: bool
    """The shared member lock (an instance), else a slot's lock."""
    key: int
    """The slot, for a slot lock."""
    pid: int
    application_name: str | None
    client_addr: str | None
    user_name: str | None
    relay_login: bool
    """Whether the holder's login may be a relay (it may delete published rows). Any other
    login can take an advisory lock too: its locks make no instance, and the slots it holds
    are reported as held by a foreign session."""


@dataclass(frozen=True, slots=True)
class ForeignHolder:
    """A session whose login is not a relay's, holding lane locks."""

    pid: int
    user_name: str | None
    application_name: str | None
    slots: tuple[int, ...]
    """Slots it holds (their rows cannot be published while it does)."""
    member: bool
    """Whether it holds the member lock (it would count as an instance if it were trusted)."""


def relay_instances(locks: Iterable[LaneLock]) -> int:
    """Running relay instances: the relay logins' sessions holding the member lock."""
    return len({lk.pid for lk in locks if lk.member and lk.relay_login})


def foreign_holders(locks: Iterable[LaneLock]) -> list[ForeignHolder]:
    """The sessions of other logins holding lane locks, by pid."""
    slots: dict[int, list[int]] = {}
    first: dict[int, LaneLock] = {}
    member: set[int] = set()
    for lk in locks:
        if lk.relay_login:
            continue
        first.setdefault(lk.pid, lk)
        if lk.member:
            member.add(lk.pid)
        else:
            slots.setdefault(lk.pid, []).append(lk.key)
    return [
        ForeignHolder(
            pid=pid,
            user_name=lk.user_name,
            application_name=lk.application_name,
            slots=tuple(sorted(slots.get(pid, ()))),
            member=pid in member,
        )
        for pid, lk in sorted(first.items())
    ]


@dataclass(frozen=True, slots=True)
class LanePlan:
    """What an instance does at one look: lanes to try to take, lanes to give back."""

    acquire: tuple[int, ...] = ()
    release: tuple[int, ...] = ()


def plan_lanes(
    lanes: int, instances: int, mine: Collection[int], others: Collection[int]
) -> LanePlan:
    """The next step towards this instance's share.

    `mine`: lanes this instance holds; `others`: lanes any other session holds a slot of.
    Surplus goes back highest lane first; free lanes are taken lowest first.
    """
    target = share(lanes, instances)
    held = sorted(mine)
    if len(held) > target:
        return LanePlan(release=tuple(held[target:]))
    free = [lane for lane in range(lanes) if lane not in mine and lane not in others]
    return LanePlan(acquire=tuple(free[: target - len(held)]))


# -- settle ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Refusal:
    """A row to quarantine, and why."""

    record: OutboxRecord
    failure: DeliveryFailure


@dataclass(frozen=True, slots=True)
class Settlement:
    """The decision on one round's rows."""

    delete: tuple[int, ...]
    """Outbox ids the broker acknowledged, before the stop."""
    quarantine: tuple[Refusal, ...]
    """Rows refused for good, before the stop, in id order."""
    stopped_at: OutboxRecord | None = None
    """The first row that waits for another round (None: the whole round was settled)."""
    stop_failure: DeliveryFailure | None = None
    """Why it waits: its retriable (or cluster-wide) failure, or None when it has no outcome
    at all."""
    waiting: int = 0
    """Rows left in the outbox for the next round: `stopped_at` and all after it."""

    @property
    def stopped(self) -> bool:
        return self.stopped_at is not None

    def stop_reason(self) -> str | None:
        """One line for logs and readiness: what holds the round, on which row."""
        if self.stopped_at is None:
            return None
        detail = str(self.stop_failure) if self.stop_failure else "no acknowledgement"
        return f"{detail} (outbox id {self.stopped_at.id}, topic {self.stopped_at.topic})"


def settle(
    records: Sequence[OutboxRecord],
    acknowledged: Collection[int],
    failures: Mapping[int, DeliveryFailure],
    ids: Iterable[int] | None = None,
) -> Settlement:
    """Decide each row of a round from the tracker's outcome (keyed by outbox id).

    `ids`: the records' ids in the same order, if the caller keeps them (the in-flight
    window does): each run of acknowledged rows is then taken in one C-level pass
    (`takewhile` over the ids), which is all a healthy flow ever sees; only a row that is
    not acknowledged costs a look of its own.
    """
    delete: list[int] = []
    quarantine: list[Refusal] = []
    remaining = iter(ids if ids is not None else [r.id for r in records])
    acked = acknowledged.__contains__
    total = len(records)
    index = 0
    while True:
        run = list(takewhile(acked, remaining))  # also consumes the first row not in it
        delete.extend(run)
        index += len(run)
        if index >= total:
            return Settlement(delete=tuple(delete), quarantine=tuple(quarantine))
        record = records[index]
        failure = failures.get(record.id)
        if failure is not None and not failure.retriable:
            quarantine.append(Refusal(record, failure))
            index += 1
            continue
        return Settlement(
            delete=tuple(delete),
            quarantine=tuple(quarantine),
            stopped_at=record,
            stop_failure=failure,
            waiting=total - index,
        )


# -- pause -------------------------------------------------------------------------------

TOPIC_REFUSALS: Final = frozenset({"topic-authorization", "unknown-topic", "partition-count"})
"""Reasons that are one topic's: only an acknowledgement of that topic lifts them. The others
(authentication, cluster authorization) are the client's: any acknowledgement does."""


@dataclass(frozen=True, slots=True)
class Pause:
    """What the cluster refused, on which row, since when (monotonic seconds)."""

    failure: DeliveryFailure
    topic: str
    """The topic of the first row refused (for a refusal of the client: where it showed)."""
    outbox_id: int
    since: float

    def same_refusal(self, other: Pause) -> bool:
        # By reason, not code: librdkafka answers a missing topic with the broker's
        # UNKNOWN_TOPIC_OR_PART first and its own _UNKNOWN_TOPIC from cached metadata after,
        # one refusal that must not be announced again at every retry.
        return (self.failure.reason, self.topic) == (other.failure.reason, other.topic)

    def lifted_by(self, acknowledged: Collection[str]) -> bool:
        """Whether acknowledgements of rows of these topics show the refusal is gone."""
        if self.failure.reason in TOPIC_REFUSALS:
            return self.topic in acknowledged
        return bool(acknowledged)

    def describe(self) -> str:
        """One line for readiness: what the cluster refuses, on which topic."""
        return f"refused by the cluster: {self.failure} (topic {self.topic})"


def refusal_of(
    stop: DeliveryFailure | None, client: DeliveryFailure | None
) -> DeliveryFailure | None:
    """The cluster-wide refusal that stopped a flow, if it was one.

    `stop`: the failure of the first row that waits (None: it had no outcome at all);
    `client`: a cluster-wide refusal the producer reported for itself meanwhile. The row's
    own failure decides when it names the cluster; a row that only timed out while the
    client was refused its credentials was refused too (an authentication failure reaches
    the records as timeouts, never as their own error).
    """
    if stop is not None and stop.cluster_wide:
        return stop
    if client is not None and client.cluster_wide and (stop is None or stop.retriable):
        return client
    return None


def next_pause(
    current: Pause | None,
    refused: Pause | None,
    *,
    acknowledged: Collection[str],
    idle: bool,
) -> Pause | None:
    """The relay's pause after a round.

    `refused`: the round stopped on a cluster-wide refusal (a pause that is already on for
    the same refusal keeps its start). Otherwise the pause ends once Kafka acknowledged a
    row it lifts (`acknowledged`: topics of rows acknowledged in the round) or when nothing
    waits any more (`idle`); an outage, or acknowledgements still pending, change nothing.
    """
    if refused is not None:
        if current is not None and current.same_refusal(refused):
            return current
        return refused
    if current is not None and (idle or current.lifted_by(acknowledged)):
        return None
    return current
