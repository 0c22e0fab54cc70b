"""Lanes of the outbox: which relay instance publishes which rows. Pure.

Every outbox row carries the slot of its message key (`key_slot`): a stable hash of the key
modulo `SLOTS`, computed when the row is written and never changed. A lane is a group of
slots (`slot % lanes == lane`); `lanes` is a relay setting. A relay instance publishes a
slot only while it holds that slot's session advisory lock, so the rows of one key (one
slot, whatever the lane count) have one publisher at a time and go out in outbox id order.

Because exclusion is per slot, the lane count may differ between instances for a while
(a rolling change of the setting): two instances never hold the same slot, and a lane one
of them cannot take whole is simply left to the other until the rollout ends.

Balancing: each instance aims at `ceil(lanes / instances)` lanes. One below its share takes
free lanes; one above it gives back its surplus (after the lane's in-flight records are
settled), so a newcomer gets its share and a dead instance's lanes (its locks end with its
connection) are taken by the others at their next look.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Final

__all__ = [
    "DEFAULT_LANES",
    "LANE_LOCK_CLASS",
    "MAX_LANES",
    "MEMBER_LOCK_CLASS",
    "SLOTS",
    "LanePlan",
    "key_slot",
    "lane_of_slot",
    "lock_class",
    "plan_lanes",
    "share",
    "slots_of",
]

SLOTS: Final = 64
"""Fixed for good: a key's slot is stored with its rows, and a different modulus would move
keys between slots while rows wait. The lane count is at most this."""
MAX_LANES: Final = SLOTS
DEFAULT_LANES: Final = 8
"""`IDENTITY_FANOUT_OUTBOX_LANES` unless set."""


def lock_class(name: str) -> int:
    """A positive int4 advisory-lock class from a name: sha256's first 4 bytes, top bit off
    (positive, so it reads the same in `pg_locks.classid`, an unsigned oid)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big") & 0x7FFFFFFF


LANE_LOCK_CLASS: Final = lock_class("pin-outbox-relay:identity.outbox")
"""First key of a slot's advisory lock `(LANE_LOCK_CLASS, slot)`."""
MEMBER_LOCK_CLASS: Final = lock_class("pin-outbox-relay-members:identity.outbox")
"""First key of the shared lock `(MEMBER_LOCK_CLASS, 0)` every running relay holds."""


def key_slot(key: str) -> int:
    """The slot of a message key: sha256 of its UTF-8 bytes, first byte, modulo `SLOTS`.

    The migration computes the same for existing rows in SQL
    (`get_byte(sha256(convert_to(key, 'UTF8')), 0) % 64`).
    """
    return hashlib.sha256(key.encode()).digest()[0] % SLOTS


def lane_of_slot(slot: int, lanes: int) -> int:
    return slot % lanes


def slots_of(lanes_held: Iterable[int], lanes: int) -> list[int]:
    """Every slot of the given lanes, ascending."""
    wanted = set(lanes_held)
    return [s for s in range(SLOTS) if s % lanes in wanted]


def share(lanes: int, instances: int) -> int:
    """Lanes one instance aims at: ceil(lanes / instances), every lane covered."""
    return -(-lanes // max(1, instances))


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
