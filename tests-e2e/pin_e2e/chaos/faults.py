"""The faults a campaign draws from, and the seeded schedule that replays exactly.

A fault has a kind, a target (a process of the system, the broker, PostgreSQL) and a
duration; network faults also name the dependency whose path they cut or slow. The schedule
is pure: the same seed, count and targets give the same faults at the same offsets, so a
failed campaign is rerun with its printed seed.

The long campaign (`make chaos`) then plays the long faults (`long_faults`) one after the
other: each lasts longer than the window of the alerts it must raise (`PAGES`), and the
campaign checks that those alerts fired while it lasted — every stall pages.

Every campaign, short or long, plays a snapshot held on each service's database after the
random faults (`held_snapshots`), checked against its alert the same way; the campaign's
Prometheus evaluates that alert with shortened windows (`chaos.rules`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

__all__ = [
    "DEPENDENCIES",
    "HELD_SNAPSHOT_SECONDS",
    "LONG_FAULTS",
    "PAGES",
    "SHORT_FAULTS",
    "TOPIC_FAULTS",
    "Fault",
    "FaultKind",
    "held_snapshots",
    "keeps_firing",
    "long_faults",
    "pages",
    "schedule",
]


class FaultKind(StrEnum):
    """What happens; the values are what the timeline and the table print."""

    SIGKILL = "SIGKILL"
    SIGTERM = "SIGTERM (restart)"
    BROKER_SIGKILL = "broker SIGKILL"
    BROKER_SIGTERM = "broker SIGTERM"
    POSTGRES_RESTART_FAST = "PostgreSQL restart (fast)"
    POSTGRES_RESTART_IMMEDIATE = "PostgreSQL restart (immediate)"
    HOT_ROW_LOCK = "lock held on hot rows"
    PARTITIONS_ADDED = "partitions added (3 -> 6, both identity topics)"
    LATENCY = "latency"
    STALL = "stalled connection"
    RESET = "connection reset"
    PARTITION = "network partition"
    ALL_RELAYS_DOWN = "every relay down"
    ALL_CONSUMERS_DOWN = "every consumer down"
    ALL_BATCHES_FAILING = "every worker batch failing (role_assignments refused to the workers)"
    PARTIAL_OUTAGE = "partial outage (the workers' PostgreSQL paths flapping)"
    HELD_SNAPSHOT = "snapshot held (a session idle in a REPEATABLE READ transaction)"


PROCESS_FAULTS: Final = (FaultKind.SIGKILL, FaultKind.SIGTERM)
"""Faults of one service process (any kind: worker, relay, consumer, access cache)."""
NETWORK_FAULTS: Final = (
    FaultKind.LATENCY,
    FaultKind.STALL,
    FaultKind.RESET,
    FaultKind.PARTITION,
)
"""Faults of one process's path to one dependency (Toxiproxy)."""
SERVER_FAULTS: Final = (
    FaultKind.BROKER_SIGKILL,
    FaultKind.BROKER_SIGTERM,
    FaultKind.POSTGRES_RESTART_FAST,
    FaultKind.POSTGRES_RESTART_IMMEDIATE,
    FaultKind.HOT_ROW_LOCK,
)
LONG_FAULTS: Final = (
    FaultKind.ALL_RELAYS_DOWN,
    FaultKind.ALL_CONSUMERS_DOWN,
    FaultKind.ALL_BATCHES_FAILING,
    FaultKind.PARTIAL_OUTAGE,
)
"""Faults of a whole kind of process or of every path at once, played by the long campaign
only, one at a time and long enough to page (never drawn at random)."""
HELD_FAULTS: Final = (FaultKind.HELD_SNAPSHOT,)
"""Played by every campaign after the random faults (`held_snapshots`), never drawn."""
SHORT_FAULTS: Final = tuple(kind for kind in FaultKind if kind not in LONG_FAULTS + HELD_FAULTS)
"""The kinds a schedule draws: a campaign of at least this many faults plays each of them."""
HELD_DATABASES: Final[dict[str, frozenset[str]]] = {
    "identity": frozenset({"IdentityPostgresHorizonHeld"}),
    "rewards": frozenset({"RewardsMembershipPostgresHorizonHeld"}),
}
"""The databases a snapshot is held on, and the alert each must raise."""
HELD_SNAPSHOT_SECONDS: Final = 90.0
"""How long the snapshots are held: the campaign's shortened window of the horizon alerts
(age > 20 s for 15 s, `chaos.rules`) plus the watch's 15 s poll and a margin."""
TOPIC_FAULTS: Final = (FaultKind.PARTITIONS_ADDED,)
"""Faults of the topics themselves, drawn at most once per campaign: partitions only grow,
and the topics stay grown (their alerts keep firing to the end, `keeps_firing`)."""
GROWN_PARTITIONS: Final = 6
TOPICS: Final = "topics"
DEPENDENCIES: Final = ("postgres", "kafka")
BROKER: Final = "broker"
POSTGRES: Final = "postgres"

_DURATIONS: Final[dict[FaultKind, tuple[float, float]]] = {
    FaultKind.SIGKILL: (0.0, 0.0),  # restarted at once, like a Deployment's pod
    FaultKind.SIGTERM: (0.0, 0.0),
    FaultKind.BROKER_SIGKILL: (3.0, 10.0),
    FaultKind.BROKER_SIGTERM: (3.0, 10.0),
    FaultKind.POSTGRES_RESTART_FAST: (1.0, 5.0),
    FaultKind.POSTGRES_RESTART_IMMEDIATE: (1.0, 5.0),
    FaultKind.HOT_ROW_LOCK: (2.0, 8.0),
    # The window of its alerts (the lag watcher's 5 s pass, then 1 minute of `for`) twice
    # and a margin: a lag watcher restarted, or the broker down, meanwhile starts the `for`
    # again (a campaign's other faults overlap this one). The topics stay grown after it,
    # only the matrix's window ends.
    FaultKind.PARTITIONS_ADDED: (180.0, 180.0),
    FaultKind.LATENCY: (3.0, 10.0),
    FaultKind.STALL: (2.0, 8.0),
    FaultKind.RESET: (0.0, 0.0),
    FaultKind.PARTITION: (2.0, 10.0),
}


# How long each long fault lasts: the window of the alerts it must raise plus a margin for
# scraping and evaluation. IdentityOutboxRelayAbsent and RewardsMembershipConsumerAbsent
# need 5 minutes without a series and 1 minute of `for`; RewardsMembershipLagHigh an
# unconsumed record 5 minutes old and 2 minutes of `for`; IdentityFanoutNoSuccessfulRun 5
# minutes without a successful run and 1 minute of `for`. The partial outage lasts the 10
# minutes after which no task may be Failed.
_LONG_DURATIONS: Final[dict[FaultKind, float]] = {
    FaultKind.ALL_RELAYS_DOWN: 8 * 60.0,
    FaultKind.ALL_CONSUMERS_DOWN: 9 * 60.0,
    FaultKind.ALL_BATCHES_FAILING: 8 * 60.0,
    FaultKind.PARTIAL_OUTAGE: 10 * 60.0,
}
_LONG_TARGETS: Final[dict[FaultKind, str]] = {
    FaultKind.ALL_RELAYS_DOWN: "relays",
    FaultKind.ALL_CONSUMERS_DOWN: "consumers",
    FaultKind.ALL_BATCHES_FAILING: POSTGRES,
    FaultKind.PARTIAL_OUTAGE: "workers",
}
LONG_GAP: Final = 6 * 60.0
"""Between two long faults: the system catches up and the alerts resolve (an errors alert
keeps its 5-minute window after the cause is gone)."""

PAGES: Final[dict[FaultKind, frozenset[str]]] = {
    FaultKind.ALL_RELAYS_DOWN: frozenset({"IdentityOutboxRelayAbsent", "IdentityOutboxStalled"}),
    FaultKind.ALL_CONSUMERS_DOWN: frozenset(
        {"RewardsMembershipConsumerAbsent", "RewardsMembershipLagHigh"}
    ),
    FaultKind.ALL_BATCHES_FAILING: frozenset({"IdentityFanoutNoSuccessfulRun"}),
    FaultKind.PARTITIONS_ADDED: frozenset(
        {"IdentityAccessTopicPartitionsChanged", "RewardsMembershipTopicPartitionsChanged"}
    ),
}
"""The alert matrix: what must fire while a fault of that kind lasts its whole duration.
Short faults page nothing (each is shorter than every alert's window) but the topics'
partitions added, which last their alerts' window; the partial outage must leave no task
Failed, whatever pages."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault of the schedule: `at` seconds after the campaign's start, for `duration`."""

    number: int
    at: float
    kind: FaultKind
    target: str
    """A process label, or `broker` / `postgres` for the servers."""
    dependency: str | None = None
    """postgres or kafka for a network fault: whose path is hit."""
    duration: float = 0.0

    def describe(self) -> str:
        if self.kind in NETWORK_FAULTS:
            return f"{self.kind} {self.target} -> {self.dependency} {self.duration:.0f}s"
        if self.kind in PROCESS_FAULTS:
            return f"{self.kind} {self.target}"
        lasting = f" {self.duration:.0f}s" if self.duration else ""
        if self.kind is FaultKind.HELD_SNAPSHOT:
            return f"{self.kind} on {self.target}{lasting}"
        return f"{self.kind}{lasting}"


def schedule(
    seed: int, count: int, processes: Mapping[str, Sequence[str]], *, span: float
) -> list[Fault]:
    """`count` faults over `span` seconds, drawn with `seed`; every kind at least once when
    `count` allows, then at random. `processes` maps each process label to the dependencies
    it talks to (a network fault cuts one of those). Offsets are sorted; a fault may start
    while an earlier one lasts (production brings them in combinations)."""
    if count < 1 or not processes or span <= 0:
        raise ValueError("a schedule needs at least one fault, one process and a span")
    labels = sorted(processes)
    connected = [label for label in labels if processes[label]]
    rng = random.Random(seed)
    short = list(SHORT_FAULTS)
    kinds = list(short)
    rng.shuffle(kinds)
    drawn = kinds[:count] + [rng.choice(short) for _ in range(count - len(kinds))]
    # Partitions only grow: a topic fault drawn again is another kind.
    others = [kind for kind in short if kind not in TOPIC_FAULTS]
    for index in [i for i, kind in enumerate(drawn) if kind in TOPIC_FAULTS][1:]:
        drawn[index] = rng.choice(others)
    offsets = sorted(rng.uniform(0.0, span) for _ in drawn)
    faults: list[Fault] = []
    for number, (at, kind) in enumerate(zip(offsets, drawn, strict=True), start=1):
        low, high = _DURATIONS[kind]
        duration = round(rng.uniform(low, high), 1)
        if kind in PROCESS_FAULTS:
            faults.append(Fault(number, at, kind, rng.choice(labels)))
        elif kind in TOPIC_FAULTS:
            faults.append(Fault(number, at, kind, TOPICS, duration=duration))
        elif kind in NETWORK_FAULTS:
            target = rng.choice(connected)
            dependency = rng.choice(sorted(processes[target]))
            faults.append(Fault(number, at, kind, target, dependency, duration))
        else:
            server = BROKER if kind.name.startswith("BROKER") else POSTGRES
            faults.append(Fault(number, at, kind, server, duration=duration))
    return faults


def keeps_firing(faults: Sequence[Fault]) -> frozenset[str]:
    """The alerts of `faults` that fire to the campaign's end: a grown topic stays grown (as
    in production, until its consumers move to a new topic version)."""
    return frozenset(
        alert for fault in faults if fault.kind in TOPIC_FAULTS for alert in PAGES[fault.kind]
    )


def long_faults(after: float, first_number: int) -> list[Fault]:
    """The long faults, one after the other from `after` seconds, numbered from
    `first_number`, each followed by `LONG_GAP`."""
    faults: list[Fault] = []
    at = after
    for number, kind in enumerate(LONG_FAULTS, start=first_number):
        target = _LONG_TARGETS[kind]
        faults.append(Fault(number, at, kind, target, duration=_LONG_DURATIONS[kind]))
        at += _LONG_DURATIONS[kind] + LONG_GAP
    return faults


def held_snapshots(after: float, first_number: int) -> list[Fault]:
    """A snapshot held on each service's database at once, from `after` seconds, for
    `HELD_SNAPSHOT_SECONDS`, numbered from `first_number`."""
    return [
        Fault(number, after, FaultKind.HELD_SNAPSHOT, database, duration=HELD_SNAPSHOT_SECONDS)
        for number, database in enumerate(sorted(HELD_DATABASES), start=first_number)
    ]


def pages(fault: Fault) -> frozenset[str]:
    """The alerts `fault` must raise while it lasts (none for a short one)."""
    if fault.kind is FaultKind.HELD_SNAPSHOT:
        return HELD_DATABASES[fault.target]
    return PAGES.get(fault.kind, frozenset())
