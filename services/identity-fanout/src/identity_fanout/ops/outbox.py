"""`identity-fanout outbox status`: what waits in the outbox and who publishes it."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import msgspec
import psycopg
from psycopg.rows import TupleRow

from identity_fanout.ops.cells import NULL
from identity_fanout.outbox.pause_mark import base_name, pause_of
from identity_fanout.outbox.rules import (
    DEFAULT_LANES,
    ForeignHolder,
    LaneLock,
    foreign_holders,
    lane_of_slot,
    relay_instances,
    slots_of,
)
from identity_fanout.outbox.store import OutboxStore
from pin_runtime.listing import Fields


class RelayHolder(msgspec.Struct, frozen=True, kw_only=True):
    """A relay session holding outbox lanes (from pg_locks / pg_stat_activity)."""

    pid: int
    """The PostgreSQL backend's pid of the session (not the relay's process id)."""
    application_name: str | None
    """`identity-fanout-relay@HOST`: which relay process this session is."""
    client_addr: str | None
    """None for a local socket, or when this login may not read it (no pg_read_all_stats)."""
    lanes: tuple[int, ...] = ()
    """The lanes whose every slot this session holds."""


class RelayPause(msgspec.Struct, frozen=True, kw_only=True):
    """A running relay instance that holds its rows for a refusal of the cluster, as its
    lanes' session names it (`outbox.pause_mark`)."""

    pid: int
    application_name: str | None
    """The session's name without the pause's mark."""
    client_addr: str | None
    reason: str
    """What the cluster refuses (the relay's `relay paused` reason: unknown-topic,
    topic-authorization, authentication, ...)."""
    topic: str | None
    """Where it showed (None: the name had no room for it; the relay's log has it)."""


class OutboxStatus(msgspec.Struct, frozen=True, kw_only=True):
    """What `identity-fanout outbox status` prints."""

    backlog: int
    oldest_created_at: datetime | None
    """created_at of the oldest waiting row (lowest id)."""
    oldest_age_seconds: float | None
    by_topic: dict[str, int]
    relay_active: bool
    """True while some relay instance holds a lane."""
    relay: RelayHolder | None
    """The session holding the most lanes (None: nothing is being published)."""
    lanes: int = DEFAULT_LANES
    holders: tuple[RelayHolder, ...] = ()
    """Every relay session holding lanes, most lanes first."""
    instances: int = 0
    """Running relay instances (holding lanes or not)."""
    backlog_by_lane: dict[int, int] = msgspec.field(default_factory=dict)
    oldest_age_by_lane: dict[int, float] = msgspec.field(default_factory=dict)
    """Seconds the oldest waiting row of each lane has waited (lanes with rows only)."""
    quarantined: dict[str, int] = msgspec.field(default_factory=dict)
    """Rows Kafka refused for good, by topic (`outbox quarantine list`)."""
    foreign: tuple[ForeignHolder, ...] = ()
    """Sessions of other logins holding lane locks (their slots are not published)."""
    paused: tuple[RelayPause, ...] = ()
    """Running relay instances paused for a refusal of the cluster, and why."""


def outbox_status(
    conn: psycopg.Connection[TupleRow], store: OutboxStore, *, lanes: int = DEFAULT_LANES
) -> OutboxStatus:
    """Backlog, head age, per-topic and per-lane counts, who holds which lane, quarantine."""
    by_topic = store.rows_by_topic(conn)
    head = store.head(conn)
    locks = store.lane_locks(conn)
    holders = _holders([lk for lk in locks if lk.relay_login], lanes)
    by_lane: dict[int, int] = {}
    oldest_by_lane: dict[int, float] = {}
    for slot, count, age in store.backlog_by_slot(conn):
        lane = lane_of_slot(slot, lanes)
        by_lane[lane] = by_lane.get(lane, 0) + count
        oldest_by_lane[lane] = max(oldest_by_lane.get(lane, 0.0), 0.0, age)
    return OutboxStatus(
        backlog=sum(by_topic.values()),
        oldest_created_at=head[0] if head else None,
        oldest_age_seconds=head[1] if head else None,
        by_topic=by_topic,
        relay_active=bool(holders),
        relay=holders[0] if holders else None,
        lanes=lanes,
        holders=tuple(holders),
        instances=relay_instances(locks),
        backlog_by_lane=dict(sorted(by_lane.items())),
        oldest_age_by_lane={lane: round(age, 1) for lane, age in sorted(oldest_by_lane.items())},
        quarantined=store.quarantine_counts(conn),
        foreign=tuple(foreign_holders(locks)),
        paused=_paused(locks),
    )


def _paused(locks: list[LaneLock]) -> tuple[RelayPause, ...]:
    """Every relay instance (its member lock) whose session's name carries a pause."""
    paused: dict[int, RelayPause] = {}
    for lk in locks:
        mark = pause_of(lk.application_name) if lk.member and lk.relay_login else None
        if mark is not None:
            paused[lk.pid] = RelayPause(
                pid=lk.pid,
                application_name=base_name(lk.application_name),
                client_addr=lk.client_addr,
                reason=mark.reason,
                topic=mark.topic,
            )
    return tuple(paused[pid] for pid in sorted(paused))


def _holders(locks: list[LaneLock], lanes: int) -> list[RelayHolder]:
    slots: dict[int, set[int]] = {}
    who: dict[int, tuple[str | None, str | None]] = {}
    for lk in locks:
        if not lk.member:
            slots.setdefault(lk.pid, set()).add(lk.key)
            who[lk.pid] = (base_name(lk.application_name), lk.client_addr)
    holders = [
        RelayHolder(
            pid=pid,
            application_name=who[pid][0],
            client_addr=who[pid][1],
            lanes=tuple(lane for lane in range(lanes) if set(slots_of([lane], lanes)) <= held),
        )
        for pid, held in slots.items()
    ]
    return sorted(holders, key=lambda h: (-len(h.lanes), h.pid))


def status_table(status: OutboxStatus) -> Fields:
    """`identity-fanout outbox status`: a table where it fits, else `field: value` lines."""
    pairs: list[tuple[str, str]] = [("backlog", str(status.backlog))]
    pairs.append(
        (
            "oldest",
            NULL
            if status.oldest_created_at is None
            else f"{status.oldest_created_at.isoformat(timespec='seconds')} "
            f"({status.oldest_age_seconds or 0.0:.1f}s ago)",
        )
    )
    pairs += [(f"topic {topic}", str(count)) for topic, count in status.by_topic.items()]
    pairs += [
        (f"quarantined {topic}", f"{count} (outbox quarantine list)")
        for topic, count in status.quarantined.items()
    ]
    pairs += [
        (f"lane {lane}", f"{count} (oldest {status.oldest_age_by_lane.get(lane, 0.0):.1f}s)")
        for lane, count in status.backlog_by_lane.items()
    ]
    if not status.holders:
        pairs.append(
            (
                "relay",
                f"none holds a lane (nothing is being published; {status.instances} running)",
            )
        )
    held = {lane for holder in status.holders for lane in holder.lanes}
    pairs += [
        (
            f"relay session pid {holder.pid}",
            f"lanes {_ranges(holder.lanes)}: {holder.application_name or NULL}"
            + (f" from {holder.client_addr}" if holder.client_addr else ""),
        )
        for holder in status.holders
    ]
    pairs += [
        (
            f"foreign session pid {holder.pid}",
            f"slots {_ranges(holder.slots)}{' + member lock' if holder.member else ''}:"
            f" {holder.user_name or NULL} as {holder.application_name or NULL}"
            " (not a relay login: these slots are not published while it holds them)",
        )
        for holder in status.foreign
    ]
    pairs += [
        (
            f"relay session pid {pause.pid} paused",
            f"{pause.reason}"
            + (f" on {pause.topic}" if pause.topic else "")
            + f": {pause.application_name or NULL} holds its rows until the cluster takes"
            " them (relay paused in its log; IdentityOutboxRelayRefused)",
        )
        for pause in status.paused
    ]
    unheld = [lane for lane in range(status.lanes) if lane not in held]
    if status.holders and unheld:
        pairs.append(("lanes unheld", f"{_ranges(unheld)} (taken within seconds by a relay)"))
    return Fields(pairs, title="outbox")


def _ranges(lanes: Sequence[int]) -> str:
    return ", ".join(str(lane) for lane in lanes) or NULL
