"""The faults a campaign draws from, and the seeded schedule that replays exactly.

A fault has a kind, a target (a process of the system, the broker, PostgreSQL) and a
duration; network faults also name the dependency whose path they cut or slow. The schedule
is pure: the same seed, count and targets give the same faults at the same offsets, so a
failed campaign is rerun with its printed seed.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

__all__ = [
    "DEPENDENCIES",
    "Fault",
    "FaultKind",
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
    LATENCY = "latency"
    STALL = "stalled connection"
    RESET = "connection reset"
    PARTITION = "network partition"


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
    FaultKind.LATENCY: (3.0, 10.0),
    FaultKind.STALL: (2.0, 8.0),
    FaultKind.RESET: (0.0, 0.0),
    FaultKind.PARTITION: (2.0, 10.0),
}


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
    kinds = list(FaultKind)
    rng.shuffle(kinds)
    drawn = kinds[:count] + [rng.choice(list(FaultKind)) for _ in range(count - len(kinds))]
    offsets = sorted(rng.uniform(0.0, span) for _ in drawn)
    faults: list[Fault] = []
    for number, (at, kind) in enumerate(zip(offsets, drawn, strict=True), start=1):
        low, high = _DURATIONS[kind]
        duration = round(rng.uniform(low, high), 1)
        if kind in PROCESS_FAULTS:
            faults.append(Fault(number, at, kind, rng.choice(labels)))
        elif kind in NETWORK_FAULTS:
            target = rng.choice(connected)
            dependency = rng.choice(sorted(processes[target]))
            faults.append(Fault(number, at, kind, target, dependency, duration))
        else:
            server = BROKER if kind.name.startswith("BROKER") else POSTGRES
            faults.append(Fault(number, at, kind, server, duration=duration))
    return faults
