"""What must hold once the campaign's system has converged, checked from the outside.

Pure functions of what the campaign collected (topic records, rows of both databases, the
access cache's applications); each returns an `Invariant` with the figures the table shows.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

from pin_contracts import ContractViolation, DeadLetterInfo, decode_access_changed
from pin_e2e.checks import SnapshotKey, analyse_access, membership_differences
from pin_testkit.records import Record

__all__ = [
    "Invariant",
    "access_delivered",
    "cache_reset_in_time",
    "duplicates_bounded",
    "keys_on_one_partition",
    "last_event_is_final",
    "memberships_match",
    "poison_isolated",
]


@dataclass(frozen=True, slots=True)
class Invariant:
    name: str
    holds: bool
    detail: str


def access_delivered(
    records: Sequence[Record],
    roles: Mapping[str, tuple[int, Mapping[UUID, set[SnapshotKey]]]],
) -> Invariant:
    """Every user of every role received the role's final Version, with its final snapshot.

    `roles`: code -> (final Version, expected snapshot per user)."""
    lost = wrong = users = 0
    for version, expected in roles.values():
        delivery = analyse_access(records, users=expected, version=version)
        users += len(expected)
        lost += len(delivery.lost)
        wrong += len(delivery.wrong_snapshots) + len(delivery.wrong_fields)
    return Invariant(
        "every user of every role change received its event",
        lost == 0 and wrong == 0,
        f"{users:,} users of {len(roles)} roles: {lost} lost, {wrong} wrong snapshots or fields",
    )


def _access_events(records: Iterable[Record]) -> Iterable[tuple[Record, Any]]:
    for record in records:
        try:
            yield record, decode_access_changed(record.value)
        except ContractViolation:
            continue


def last_event_is_final(records: Sequence[Record], final_versions: Mapping[UUID, int]) -> Invariant:
    """Per key, the last event on the topic carries the user's final Version: versions never
    went backwards at the end (a consumer reading the topic ends on the newest)."""
    last: dict[UUID, tuple[int, int]] = {}
    for record, envelope in _access_events(records):
        user = envelope.payload.user_id
        if user in final_versions:
            seen = last.get(user)
            if seen is None or record.offset > seen[0]:
                last[user] = (record.offset, envelope.payload.version)
    behind = [u for u, v in final_versions.items() if last.get(u, (0, -1))[1] != v]
    return Invariant(
        "per key, the last access event is the final Version",
        not behind,
        f"{len(final_versions):,} keys, {len(behind)} ending on an older Version",
    )


def keys_on_one_partition(topics: Mapping[str, Sequence[Record]]) -> Invariant:
    """Per topic, every key's records sit on one partition: the order a consumer or a replay
    from offset 0 reads them in is the order they were written, partitions added or not."""
    keys = moved = 0
    spread: list[str] = []
    for topic, records in topics.items():
        partitions: dict[bytes, set[int]] = defaultdict(set)
        for record in records:
            if record.key is not None:
                partitions[record.key].add(record.partition)
        keys += len(partitions)
        off = sum(len(seen) > 1 for seen in partitions.values())
        moved += off
        if off:
            spread.append(f"{topic}: {off}")
    return Invariant(
        "per key, one partition (its order kept)",
        not moved,
        f"{keys:,} keys on {len(topics)} topics, {moved} on more than one partition"
        + (f" ({', '.join(spread)})" if spread else ""),
    )


def duplicates_bounded(records: Sequence[Record], faults: int, batch_size: int) -> Invariant:
    """Re-run fan-out batches (a new MessageId for the same user and Version) stay within one
    batch per fault; the relay's re-sends of a record (same MessageId) are counted apart."""
    ids: dict[tuple[UUID, int], set[UUID]] = defaultdict(set)
    copies = 0
    for _record, envelope in _access_events(records):
        key = (envelope.payload.user_id, envelope.payload.version)
        if envelope.message_id in ids[key]:
            copies += 1
        ids[key].add(envelope.message_id)
    repeated = sum(len(v) - 1 for v in ids.values())
    bound = faults * batch_size
    return Invariant(
        "fan-out duplicates at most one batch per fault",
        repeated <= bound,
        f"{repeated:,} re-run events (bound {bound:,} = {faults} faults x {batch_size}); "
        f"{copies:,} relay re-sends of the same record",
    )


def memberships_match(
    identity: Mapping[tuple[UUID, UUID], Mapping[str, Any]],
    rewards: Mapping[tuple[UUID, UUID], Mapping[str, Any]],
) -> Invariant:
    problems = membership_differences(None, identity, rewards)
    return Invariant(
        "membership projection equals identity, each change applied once",
        not problems,
        f"{len(identity):,} memberships, {len(problems)} differ"
        + (f"; first: {problems[0]}" if problems else ""),
    )


def poison_isolated(
    quarantined: Mapping[UUID, int],
    relay_poison: Sequence[UUID],
    dead_letters: Sequence[Record],
    consumer_poison: Sequence[tuple[int, int]],
    consumer_faults: int,
) -> Invariant:
    """Each relay poison row quarantined once (its move is one transaction); each consumer
    poison (partition, offset) in the DLQ at least once, and again at most once per fault
    that could cut a consumer off between a dead letter's acknowledgement and its inbox
    mark's commit (`consumer_faults`: a consumer killed, cut off, or losing its partitions
    to a broker fault). The dead-letterer writes no second copy otherwise: it remembers
    what the broker acknowledged, and the inbox mark does across a restart."""
    problems = [
        f"outbox {m}: {quarantined.get(m, 0)}x" for m in relay_poison if quarantined.get(m) != 1
    ]
    places: dict[tuple[int, int], int] = defaultdict(int)
    for record in dead_letters:
        info = DeadLetterInfo.from_headers(record.headers)
        if info is not None:
            places[(info.original_partition, info.original_offset)] += 1
    problems += [
        f"record {p}/{o}: {places.get((p, o), 0)}x"
        for p, o in consumer_poison
        if not 1 <= places.get((p, o), 0) <= 1 + consumer_faults
    ]
    copies = sum(places.get(place, 0) for place in consumer_poison) - len(consumer_poison)
    return Invariant(
        "each poison record isolated once (DLQ copy only after a fault)",
        not problems,
        f"{len(relay_poison)} in quarantine, {len(consumer_poison)} in the DLQ"
        f" ({max(copies, 0)} copies, bound {consumer_faults} consumer faults)"
        + (f"; {', '.join(problems)}" if problems else ""),
    )


def cache_reset_in_time(
    applied_log: Path, final_versions: Mapping[UUID, int], changed_at: float, limit: float
) -> Invariant:
    """Every user's cache entry holds the final Version within `limit` seconds of the last
    role change (the spec: caches reset within a minute)."""
    reached: dict[UUID, float] = {}
    if applied_log.exists():
        for line in applied_log.read_text(encoding="utf-8").splitlines():
            entry = json.loads(line)
            user = UUID(entry["user"])
            if final_versions.get(user) == entry["version"] and user not in reached:
                reached[user] = float(entry["at"])
    missing = len(final_versions) - len(reached)
    slowest = max(reached.values(), default=changed_at) - changed_at
    return Invariant(
        "every access cache reset after the last role change",
        missing == 0 and slowest <= limit,
        f"{len(reached):,}/{len(final_versions):,} users reset, the last after {slowest:.1f}s "
        f"(limit {limit:.0f}s)",
    )
