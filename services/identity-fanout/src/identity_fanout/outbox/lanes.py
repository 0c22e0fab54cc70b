"""Lanes of the outbox: which relay instance publishes which rows. Pure.

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
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Final, NamedTuple

__all__ = [
    "DEFAULT_LANES",
    "MAX_LANES",
    "SLOTS",
    "ForeignHolder",
    "LaneLock",
    "LanePlan",
    "foreign_holders",
    "lane_of_slot",
    "lock_class",
    "plan_lanes",
    "relay_instances",
    "share",
    "slots_of",
]

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
