"""`identity-fanout outbox status`: what waits in the outbox, who publishes it and which
open writers hold it back."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Final

import msgspec
import psycopg
from psycopg.rows import TupleRow

from identity_fanout.ops.cells import NULL, duration_cell
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
from identity_fanout.outbox.store import OpenWriterRow, OutboxStore
from pin_runtime.listing import Fields

WRITER_OPEN_LONG: Final = 10.0
"""Seconds after which an open writer is marked: a writer of the service (a fan-out page, a
membership change) commits well within it, and the rows of its slots committed meanwhile
wait for its end."""


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


class OpenWriter(msgspec.Struct, frozen=True, kw_only=True):
    """A transaction holding writer locks of the outbox (`outbox/sql/frontier.sql`
    open_writers): the rows of its slots committed after it took them wait until it ends."""

    pid: int | None
    """The session's backend pid; None for a prepared transaction (see `gid`)."""
    gid: str | None
    """A prepared transaction's name (COMMIT PREPARED / ROLLBACK PREPARED)."""
    slots: tuple[int, ...]
    lanes: tuple[int, ...]
    """The lanes of its slots, by the status's lane count."""
    user_name: str | None
    """The session's login, or a prepared transaction's owner."""
    application_name: str | None
    state: str | None
    """pg_stat_activity's state (`idle in transaction`, `active`, ...), `prepared`, or None
    when this login may not read it (another login's session, without pg_read_all_stats)."""
    since: datetime | None
    """When its transaction started (a prepared one: when it was prepared); None: unknown."""
    open_seconds: float | None
    """Seconds since `since`; None: unknown."""
    long_open: bool | None
    """Open longer than `WRITER_OPEN_LONG`; None when its age is unknown."""


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
    open_writers: tuple[OpenWriter, ...] = ()
    """Transactions holding writer locks (longest open first): the relays read their slots
    only up to the rows they may still commit."""


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
        open_writers=open_writers(store.open_writers(conn), lanes),
    )


def open_writers(rows: Sequence[OpenWriterRow], lanes: int) -> tuple[OpenWriter, ...]:
    """The writers as the status shows them: their lanes, and whether they are open long."""
    return tuple(
        OpenWriter(
            pid=row.pid,
            gid=row.gid,
            slots=tuple(row.slots),
            lanes=tuple(sorted({lane_of_slot(slot, lanes) for slot in row.slots})),
            user_name=row.user_name,
            application_name=row.application_name,
            state=row.state,
            since=row.since,
            open_seconds=None if row.open_seconds is None else round(row.open_seconds, 1),
            long_open=None if row.open_seconds is None else row.open_seconds > WRITER_OPEN_LONG,
        )
        for row in rows
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
    pairs += [_writer_pair(writer) for writer in status.open_writers]
    unheld = [lane for lane in range(status.lanes) if lane not in held]
    if status.holders and unheld:
        pairs.append(("lanes unheld", f"{_ranges(unheld)} (taken within seconds by a relay)"))
    return Fields(pairs, title="outbox")


def _writer_pair(writer: OpenWriter) -> tuple[str, str]:
    """`open writer pid N` (or `prepared writer GID`): its slots, who, and how long."""
    held = f"slots {_ranges(writer.slots)} (lanes {_ranges(writer.lanes)})"
    age = duration_cell(writer.open_seconds) if writer.open_seconds is not None else "unknown"
    if writer.pid is None:
        key = f"prepared writer {writer.gid or NULL}"
        who = f"{writer.user_name or NULL}, prepared" + (
            f" {age} ago" if writer.open_seconds is not None else ""
        )
        end = "COMMIT PREPARED or ROLLBACK PREPARED"
    else:
        key = f"open writer pid {writer.pid}"
        who = (
            f"{writer.user_name or NULL} as {writer.application_name or NULL},"
            f" {writer.state or 'state unknown'}, open {age}"
            # PostgreSQL hides them in another login's session from a login without it.
            + (" (pg_read_all_stats shows them)" if writer.open_seconds is None else "")
        )
        end = "its end"
    mark = (
        f" (over {WRITER_OPEN_LONG:.0f}s: rows of these slots wait for {end})"
        if writer.long_open
        else ""
    )
    return key, f"{held}: {who}{mark}"


def _ranges(lanes: Sequence[int]) -> str:
    return ", ".join(str(lane) for lane in lanes) or NULL
